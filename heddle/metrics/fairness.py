"""Fairness between users: service received, weighted like the Virtual Token Counter (VTC).

Service is weighted tokens: prompt tokens count `prompt_weight` (default 1) and output tokens
`output_weight` (default 2), as in VTC (Sheng et al., "Fairness in Serving Large Language
Models", OSDI'24). A fair scheduler keeps the service difference between any two users that are
both backlogged bounded; `fairness()` measures that difference over fixed time windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from heddle.metrics.record import RequestRecord

ANONYMOUS = "anonymous"  # the user of records whose `user` is None


@dataclass(slots=True)
class UserService:
    user: str
    num_requests: int = 0
    num_prompt_tokens: int = 0  # of requests whose prefill completed
    num_output_tokens: int = 0
    service: float = 0.0  # weighted tokens


@dataclass(slots=True)
class WindowService:
    start: float
    end: float
    service: dict[str, float]  # weighted tokens each user received in the window
    backlogged: list[str]  # users with a request in the system throughout the window


@dataclass(slots=True)
class FairnessReport:
    prompt_weight: float
    output_weight: float
    window: float  # seconds
    users: dict[str, UserService]
    # Largest (most served - least served) among users backlogged throughout one window.
    max_service_difference: float
    max_difference_window: tuple[float, float] | None
    max_difference_users: tuple[str, str] | None  # (most served, least served)
    num_windows_compared: int  # windows with at least two backlogged users
    jain_index: float | None  # Jain's index of total service over users: 1 is equal service
    windows: list[WindowService] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fairness(
    records: Sequence[RequestRecord],
    window: float | None = None,
    prompt_weight: float = 1.0,
    output_weight: float = 2.0,
    num_windows: int = 20,
) -> FairnessReport:
    """Per-user service and the largest service gap between users backlogged in a window.

    A request's prompt tokens are served evenly from its first scheduling to its first token
    (prefill may take several chunked steps); each output token at its token time. A user is
    backlogged from a request's arrival to its finish (or the end of the run if it never
    finished). `window` defaults to the run's span divided by `num_windows`.
    """
    users: dict[str, UserService] = {}
    intervals: list[tuple[str, float, float, float]] = []  # (user, t0, t1, service)
    points: list[tuple[str, float, float]] = []  # (user, t, service)
    start, end = math.inf, -math.inf
    for r in records:
        user = r.user if r.user is not None else ANONYMOUS
        stats = users.setdefault(user, UserService(user))
        stats.num_requests += 1
        start = min(start, r.arrival_time)
        end = max(end, r.arrival_time, r.finish_time or -math.inf, *r.token_times[-1:])
        if r.first_token_time is not None:
            stats.num_prompt_tokens += r.num_prompt_tokens
            amount = prompt_weight * r.num_prompt_tokens
            t0 = r.first_scheduled_time if r.first_scheduled_time is not None else r.arrival_time
            intervals.append((user, min(t0, r.first_token_time), r.first_token_time, amount))
        stats.num_output_tokens += r.num_output_tokens
        points.extend((user, t, output_weight) for t in r.token_times)
    for stats in users.values():
        stats.service = (
            prompt_weight * stats.num_prompt_tokens + output_weight * stats.num_output_tokens
        )
    span = max(0.0, end - start) if users else 0.0
    if window is None:
        window = span / num_windows if span > 0 else 1.0
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    windows = _window_service(users, intervals, points, start, span, window) if span > 0 else []
    backlog = _backlog_intervals(records, end)
    for w in windows:
        w.backlogged = [u for u in sorted(users) if _covers(backlog.get(u, []), w.start, w.end)]
    report = FairnessReport(
        prompt_weight=prompt_weight,
        output_weight=output_weight,
        window=window,
        users=dict(sorted(users.items())),
        max_service_difference=0.0,
        max_difference_window=None,
        max_difference_users=None,
        num_windows_compared=0,
        jain_index=_jain([u.service for u in users.values()]),
        windows=windows,
    )
    for w in windows:
        if len(w.backlogged) < 2:
            continue
        report.num_windows_compared += 1
        most = max(w.backlogged, key=lambda u: w.service[u])
        least = min(w.backlogged, key=lambda u: w.service[u])
        difference = w.service[most] - w.service[least]
        if report.max_difference_window is None or difference > report.max_service_difference:
            report.max_service_difference = difference
            report.max_difference_window = (w.start, w.end)
            report.max_difference_users = (most, least)
    return report


def _window_service(
    users: dict[str, UserService],
    intervals: list[tuple[str, float, float, float]],
    points: list[tuple[str, float, float]],
    start: float,
    span: float,
    window: float,
) -> list[WindowService]:
    count = max(1, math.ceil(span / window - 1e-9))
    windows = [
        WindowService(start + i * window, start + min((i + 1) * window, span), {}, [])
        for i in range(count)
    ]
    for w in windows:
        w.service = dict.fromkeys(sorted(users), 0.0)

    def index(t: float) -> int:
        return min(count - 1, max(0, int((t - start) / window)))

    for user, t, amount in points:
        windows[index(t)].service[user] += amount
    for user, t0, t1, amount in intervals:
        if t1 <= t0:
            windows[index(t1)].service[user] += amount
            continue
        for i in range(index(t0), index(t1) + 1):
            w = windows[i]
            overlap = min(t1, w.end) - max(t0, w.start)
            if overlap > 0:
                w.service[user] += amount * overlap / (t1 - t0)
    return windows


def _backlog_intervals(
    records: Sequence[RequestRecord], end: float
) -> dict[str, list[tuple[float, float]]]:
    """Per user, the merged time intervals during which it had a request in the system."""
    raw: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        user = r.user if r.user is not None else ANONYMOUS
        finish = r.finish_time if r.finish_time is not None else end
        raw.setdefault(user, []).append((r.arrival_time, finish))
    merged: dict[str, list[tuple[float, float]]] = {}
    for user, spans in raw.items():
        out: list[tuple[float, float]] = []
        for a, b in sorted(spans):
            if out and a <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        merged[user] = out
    return merged


def _covers(spans: list[tuple[float, float]], t0: float, t1: float) -> bool:
    return any(a <= t0 and b >= t1 for a, b in spans)


def _jain(values: list[float]) -> float | None:
    """(sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one user gets everything."""
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return None
    return sum(values) ** 2 / (len(values) * squares)
