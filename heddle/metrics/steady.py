"""Steady-state measurement: a warm-up discarded, a window without the drain, trends, intervals.

A run of finite length says as much about its length as about the system: in the first seconds
the seats fill, at the end the last requests drain with no one behind them, and under sustained
overload every queue grows for as long as the run lasts, so a p99 TTFT over the whole run is a
statement about its horizon. `window_report` measures over requests that *arrive* inside a
window (default: after a warm-up of `warmup_fraction` of the arrival span, up to the last
arrival) and over the tokens computed inside it:

- throughput counts useful work done in the window: output tokens whose time falls in it, plus
  each request's prompt at its first token (recomputed prefills after a preemption are not
  useful work and are not counted);
- goodput counts requests arriving in the window that complete within their SLO, per second of
  window; requests refused at arrival (admission control) count as offered, never as good;
- `ttft_trend` is the least-squares slope of TTFT against arrival time (seconds per second):
  ~0 in a steady state, ~(1 - capacity/offered) when a queue grows without bound. A request
  without a first token by the end of the run enters with a TTFT of at least that (censored).

`phase_reports` splits a run by the load phase at each arrival (bursty arrivals: "burst" and
"calm"), so transient results are reported as such. `interval` summarizes one metric over
seeds: mean with a Student-t 95% interval, and the range.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from heddle.metrics.record import RequestRecord
from heddle.metrics.stats import LatencyStats
from heddle.metrics.summary import OVERALL, SLO, is_completed, meets_slo

Intervals = Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Refused:
    """A request refused at arrival (HTTP 429 / a shedder): it never has a record."""

    request_id: str
    arrival_time: float
    request_class: str = "default"
    reason: str = "queue_full"


@dataclass(slots=True)
class WindowClass:
    """One class (or "all") over a window."""

    request_class: str
    offered: int  # arrivals in the window, refused ones included
    refused: int
    completed: int
    unfinished: int  # admitted, arrived in the window, not completed by the end of the run
    within_slo: int | None
    goodput: float | None  # requests/s arriving in the window and completing within SLO
    request_throughput: float  # completions per second inside the window
    output_throughput: float  # output tokens per second inside the window
    total_token_throughput: float  # output + first-time prompt tokens per second
    ttft: LatencyStats = field(default_factory=LatencyStats)
    tpot: LatencyStats = field(default_factory=LatencyStats)
    e2e: LatencyStats = field(default_factory=LatencyStats)
    ttft_trend: float | None = None  # d TTFT / d arrival time, seconds per second
    num_preemptions: int = 0

    @property
    def slo_attainment(self) -> float | None:
        admitted = self.offered - self.refused
        if self.within_slo is None or admitted == 0:
            return None
        return self.within_slo / admitted

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("ttft", "tpot", "e2e"):
            out[name] = getattr(self, name).to_dict()
        out["slo_attainment"] = self.slo_attainment
        return out


@dataclass(slots=True)
class WindowReport:
    intervals: list[tuple[float, float]]  # where the measurement was taken (engine clock)
    classes: dict[str, WindowClass]  # by class, sorted, then "all"

    @property
    def duration(self) -> float:
        return sum(end - start for start, end in self.intervals)

    @property
    def overall(self) -> WindowClass:
        return self.classes[OVERALL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "intervals": self.intervals,
            "duration": self.duration,
            "classes": {k: v.to_dict() for k, v in self.classes.items()},
        }


def steady_window(
    records: Sequence[RequestRecord],
    refused: Sequence[Refused] = (),
    *,
    warmup_fraction: float = 0.2,
    warmup: float | None = None,
    end: float | None = None,
) -> tuple[float, float]:
    """(start, end) of the steady-state window: past the warm-up, up to the last arrival.

    `warmup` (seconds after the first arrival) overrides `warmup_fraction` of the arrival span.
    """
    arrivals = [r.arrival_time for r in records] + [r.arrival_time for r in refused]
    if not arrivals:
        return (0.0, 0.0)
    first, last = min(arrivals), max(arrivals)
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
    skip = warmup if warmup is not None else warmup_fraction * (last - first)
    stop = math.nextafter(last, math.inf) if end is None else end  # the last arrival is in
    return (min(first + skip, stop), stop)


def window_report(
    records: Sequence[RequestRecord],
    refused: Sequence[Refused] = (),
    *,
    intervals: Intervals | None = None,
    slo: SLO | None = None,
    warmup_fraction: float = 0.2,
    classes: Sequence[str] | None = None,
) -> WindowReport:
    """Metrics over requests arriving in `intervals` (default: the steady window) and the work
    done inside them, per class and overall. `classes` adds a group of classes as one row
    named "+".join(classes) (e.g. the latency-sensitive ones)."""
    if intervals is None:
        intervals = [steady_window(records, refused, warmup_fraction=warmup_fraction)]
    spans = sorted((float(s), float(e)) for s, e in intervals if e > s)
    run_end = max(
        (t for r in records for t in (r.finish_time, *r.token_times[-1:]) if t is not None),
        default=0.0,
    )
    inside = _Membership(spans)
    groups: dict[str, tuple[list[RequestRecord], list[Refused]]] = {}
    for r in records:
        groups.setdefault(r.request_class, ([], []))[0].append(r)
    for x in refused:
        groups.setdefault(x.request_class, ([], []))[1].append(x)
    names = sorted(groups)
    out = {name: _window_class(name, *groups[name], inside, spans, slo, run_end) for name in names}
    if classes:
        chosen = [c for c in classes if c in groups]
        joined = "+".join(classes)
        recs = [r for c in chosen for r in groups[c][0]]
        refs = [x for c in chosen for x in groups[c][1]]
        out[joined] = _window_class(joined, recs, refs, inside, spans, slo, run_end)
    out[OVERALL] = _window_class(OVERALL, records, refused, inside, spans, slo, run_end)
    return WindowReport(list(spans), out)


def phase_reports(
    records: Sequence[RequestRecord],
    refused: Sequence[Refused],
    arrival_spec: str | None,
    *,
    start: float = 0.0,
    slo: SLO | None = None,
    classes: Sequence[str] | None = None,
) -> dict[str, WindowReport]:
    """One report per load phase of `arrival_spec` ("burst": "burst" and "calm"), over the
    arrival span; times are engine-clock, with the workload's t=0 at `start`."""
    from heddle.workloads.bursts import is_profile_spec, parse_profile

    arrivals = [r.arrival_time for r in records] + [x.arrival_time for x in refused]
    if not arrivals:
        return {}
    if arrival_spec is None or not is_profile_spec(arrival_spec):
        spans = {"sustained": [(start, math.nextafter(max(arrivals), math.inf))]}
    else:
        # Closed at the last arrival, so that it is inside its phase.
        end = math.nextafter(max(arrivals) - start, math.inf)
        spans = {
            phase: [(start + a, start + b) for a, b in iv]
            for phase, iv in parse_profile(arrival_spec).spans(end).items()
        }
    return {
        phase: window_report(records, refused, intervals=iv, slo=slo, classes=classes)
        for phase, iv in sorted(spans.items())
    }


# -- over seeds -------------------------------------------------------------------------------
# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond, the normal's 1.96.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Interval:
    """One metric over seeds: mean, its 95% confidence interval (Student t), min, max."""

    n: int
    mean: float
    low: float
    high: float
    min: float
    max: float

    def text(self, fmt: str = ".2f") -> str:
        if self.n == 1:
            return format(self.mean, fmt)
        half = self.high - self.mean
        return f"{self.mean:{fmt}} ± {half:{fmt}} ({format(self.min, fmt)}–{format(self.max, fmt)})"


def interval(values: Iterable[float]) -> Interval:
    """Mean ± the t-based 95% half-width over independent runs (seeds); needs one value."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("interval of no values")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(1, mean, mean, mean, mean, mean)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    half = t * math.sqrt(var / n)
    return Interval(n, mean, mean - half, mean + half, min(xs), max(xs))


# -- internals --------------------------------------------------------------------------------
class _Membership:
    """Whether a time falls in a sorted list of disjoint half-open intervals."""

    __slots__ = ("spans",)

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.spans = spans

    def __call__(self, t: float) -> bool:
        return any(s <= t < e for s, e in self.spans)

    def count(self, sorted_times: Sequence[float]) -> int:
        """How many of `sorted_times` (ascending) fall inside."""
        return sum(
            bisect.bisect_left(sorted_times, e) - bisect.bisect_left(sorted_times, s)
            for s, e in self.spans
        )


def _window_class(
    name: str,
    records: Sequence[RequestRecord],
    refused: Sequence[Refused],
    inside: _Membership,
    spans: list[tuple[float, float]],
    slo: SLO | None,
    run_end: float,
) -> WindowClass:
    duration = sum(e - s for s, e in spans)
    arrived = [r for r in records if inside(r.arrival_time)]
    num_refused = sum(1 for x in refused if inside(x.arrival_time))
    completed = [r for r in arrived if is_completed(r)]
    with_slo = any(r.ttft_slo is not None or r.tpot_slo is not None for r in records) or (
        slo is not None and (slo.ttft is not None or slo.tpot is not None)
    )
    within = sum(1 for r in completed if meets_slo(r, slo)) if with_slo else None
    # list(): a timeline's TokenTimes indexes in O(length), and bisect indexes log(n) times.
    output_tokens = sum(inside.count(list(r.token_times)) for r in records)
    prompt_tokens = sum(
        r.num_prompt_tokens
        for r in records
        if r.first_token_time is not None and inside(r.first_token_time)
    )
    finished_inside = sum(
        1
        for r in records
        if is_completed(r) and r.finish_time is not None and inside(r.finish_time)
    )

    def rate(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    # TTFT against arrival, censored at the end of the run for requests still without a token.
    points = [
        (r.arrival_time, r.ttft if r.ttft is not None else max(0.0, run_end - r.arrival_time))
        for r in arrived
        if r.finish_reason not in ("abort", "error")
    ]
    return WindowClass(
        request_class=name,
        offered=len(arrived) + num_refused,
        refused=num_refused,
        completed=len(completed),
        unfinished=sum(1 for r in arrived if r.finish_time is None),
        within_slo=within,
        goodput=None if within is None else rate(within),
        request_throughput=rate(finished_inside),
        output_throughput=rate(output_tokens),
        total_token_throughput=rate(output_tokens + prompt_tokens),
        ttft=LatencyStats.of(t for _, t in points),
        tpot=LatencyStats.of(r.tpot for r in completed),
        e2e=LatencyStats.of(r.e2e for r in completed),
        ttft_trend=_slope(points),
        num_preemptions=sum(r.num_preemptions for r in arrived),
    )


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    n = len(points)
    mx = math.fsum(x for x, _ in points) / n
    my = math.fsum(y for _, y in points) / n
    sxx = math.fsum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return math.fsum((x - mx) * (y - my) for x, y in points) / sxx
