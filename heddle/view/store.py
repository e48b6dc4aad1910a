"""What the page reads: steps, decision events and finished requests, live or replayed.

One `ViewStore` serves both modes. Live, the engine thread appends (through the probe's sink)
and the HTTP handlers read, under one lock; bounded containers keep a long-running server's
memory flat. Replayed, it is filled once from a saved run and never changes; its events and
requests are held as columns (heddle/view/tables.py), not as dicts.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from heddle.core.events import Eviction, Preemption, QueueStop, Recompute, StallInterval
from heddle.metrics.record import RequestRecord
from heddle.metrics.summary import FAILED_REASONS, SLO
from heddle.view.explain import explain_request
from heddle.view.series import StepRow, StepSeries
from heddle.view.tables import EventTable, RequestTable

CDF_POINTS = 200


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of a live store (a replay holds everything it loads)."""

    step_rows: int | None = 100_000  # merged pairwise beyond this (older steps coarser)
    events: int | None = 100_000
    requests: int | None = 50_000
    recent_rows: int = 8_192  # raw rows kept for the page's live stream


REPLAY = Limits(step_rows=None, events=None, requests=None, recent_rows=0)


def event_to_dict(event: Any, origin: float = 0.0) -> dict[str, Any]:
    """A decision event as the page reads it (times on the view's clock)."""
    if isinstance(event, StallInterval):
        return {
            "k": "stall",
            "id": event.request_id,
            "cls": event.request_class,
            "q": event.queue,
            "s0": event.start_step,
            "s1": event.end_step,
            "t0": round(event.start_time - origin, 6),
            "t1": round(event.end_time - origin, 6),
            "sec": {k: round(v, 7) for k, v in event.seconds.items()},
        }
    if isinstance(event, Preemption):
        return {
            "k": "preempt",
            "step": event.step_id,
            "t": round(event.time - origin, 6),
            "victim": event.victim_id,
            "cls": event.victim_class,
            "for": event.beneficiary_id,
            "reason": event.reason,
        }
    if isinstance(event, Eviction):
        return {
            "k": "evict",
            "step": event.step_id,
            "t": round(event.time - origin, 6),
            "blocks": event.num_blocks,
            "for": list(event.for_request_ids),
            "kind": event.kind,
        }
    if isinstance(event, Recompute):
        end = event.end_time
        return {
            "k": "recompute",
            "id": event.request_id,
            "cls": event.request_class,
            "preempted_step": event.preempted_step,
            "s0": event.start_step,
            "s1": event.end_step,
            "t0": round(event.start_time - origin, 6),
            "t1": None if end is None else round(end - origin, 6),
            "tokens": event.num_tokens,
            "cached": event.num_cached,
            "cached_blocks": event.num_cached_blocks,
            "evicted_blocks": event.num_evicted_blocks,
            "evicted_steps": list(event.evicted_at_steps),
            "evicted_for": list(event.evicted_for),
        }
    if isinstance(event, QueueStop):
        return {
            "k": "stop",
            "step": event.step_id,
            "t": round(event.time - origin, 6),
            "q": event.queue,
            "reason": event.reason,
        }
    raise TypeError(f"not a decision event: {event!r}")


def request_row(record: RequestRecord, origin: float = 0.0) -> dict[str, Any]:
    """A finished request, compactly: times on the view's clock, no per-token list."""

    def at(t: float | None) -> float | None:
        return None if t is None else round(t - origin, 6)

    return {
        "id": record.request_id,
        "cls": record.request_class,
        "arrival": at(record.arrival_time),
        "scheduled": at(record.first_scheduled_time),
        "first_token": at(record.first_token_time),
        "finish": at(record.finish_time),
        "prompt": record.num_prompt_tokens,
        "output": record.num_output_tokens,
        "ttft": _round(record.ttft),
        "tpot": _round(record.tpot),
        "e2e": _round(record.e2e),
        "stall": round(record.stall_time, 7),
        "preemptions": record.num_preemptions,
        "cached": record.num_cached_tokens,
        "reason": record.finish_reason,
        "ttft_slo": record.ttft_slo,
        "tpot_slo": record.tpot_slo,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 7)


class ViewStore:
    def __init__(
        self,
        *,
        mode: str,
        title: str,
        limits: Limits = REPLAY,
        slo: SLO | None = None,
        origin: float = 0.0,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.mode = mode
        self.title = title
        self.limits = limits
        self.slo = slo
        self.origin = origin  # engine-clock time shown as 0
        self.info = dict(info or {})
        self.series = StepSeries(limits.step_rows)
        # Live: bounded containers of dicts; a replay (no bound): compact columns.
        self.events: deque[dict[str, Any]] | EventTable = (
            EventTable() if limits.events is None else deque(maxlen=limits.events)
        )
        self.requests: OrderedDict[str, dict[str, Any]] | RequestTable = (
            RequestTable() if limits.requests is None else OrderedDict()
        )
        self.pictures: dict[str, Any] = {}
        self._recent: deque[tuple[int, list[Any], float]] = deque(maxlen=limits.recent_rows)
        self._recent_events: deque[tuple[int, dict[str, Any]]] = deque(maxlen=limits.recent_rows)
        self._num_events = 0
        self._lock = threading.Lock()
        self.last_wall = 0.0

    # -- writing (the engine thread, or a loader) -------------------------------------------
    def add_step(self, row: StepRow, events: Iterable[Any] = (), wall: float = 0.0) -> None:
        if self.origin:
            row = replace(row, start=row.start - self.origin)
        converted = [e if isinstance(e, dict) else event_to_dict(e, self.origin) for e in events]
        with self._lock:
            self.series.append(row)
            if self.limits.recent_rows:
                self._recent.append((self.series.num_steps, row.to_list(), wall))
            for event in converted:
                self._add_event(event)
            self.last_wall = wall

    def add_events(self, events: Iterable[dict[str, Any]]) -> None:
        with self._lock:
            for event in events:
                self._add_event(event)

    def _add_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._num_events += 1
        self._recent_events.append((self._num_events, event))

    def add_records(self, records: Iterable[RequestRecord]) -> None:
        rows = [request_row(r, self.origin) for r in records]
        self.add_request_rows(rows)

    def add_request_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        bound = self.limits.requests
        with self._lock:
            requests = self.requests
            for row in rows:
                requests[row["id"]] = row
                if bound is not None and len(requests) > bound:
                    assert isinstance(requests, OrderedDict)
                    requests.popitem(last=False)

    # -- reading (HTTP handlers) ------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        with self._lock:
            series = self.series
            return {
                "mode": self.mode,
                "title": self.title,
                "num_steps": series.num_steps,
                "num_requests": len(self.requests),
                "num_events": self._num_events,
                "start": series.start_time,
                "end": series.end_time,
                "kv_total": series.kv_total,
                "keys": series.keys,
                "classes": self._classes(),
                "slo": None if self.slo is None else {"ttft": self.slo.ttft, "tpot": self.slo.tpot},
                "info": self.info,
                "limits": {
                    "step_rows": self.limits.step_rows,
                    "events": self.limits.events,
                    "requests": self.limits.requests,
                },
            }

    def _classes(self) -> list[str]:
        if isinstance(self.requests, RequestTable):
            return self.requests.classes()
        return sorted({r["cls"] for r in self.requests.values()})

    def steps(
        self, start: float | None = None, end: float | None = None, max_points: int = 1500
    ) -> dict[str, Any]:
        with self._lock:
            return self.series.window(start, end, max_points)

    def stream_since(self, seen_steps: int, seen_events: int) -> dict[str, Any]:
        """Raw rows and events the page has not had yet (as many as are still kept)."""
        with self._lock:
            rows = [(n, row, wall) for n, row, wall in self._recent if n > seen_steps]
            events = [e for n, e in self._recent_events if n > seen_events]
            return {
                "rows": [row for _, row, _ in rows],
                "walls": [round(wall, 4) for _, _, wall in rows],
                "events": events,
                "num_steps": self.series.num_steps,
                "num_events": self._num_events,
                "num_requests": len(self.requests),
                "dropped_steps": max(0, self.series.num_steps - seen_steps - len(rows)),
                "sent": round(time.time(), 4),  # the page splits its lag by it (VIEW.md)
            }

    def latency(self) -> dict[str, Any]:
        """CDFs of TTFT, TPOT and E2E per class (and "all"), and goodput against the SLO."""
        if isinstance(self.requests, RequestTable):
            return _table_latency(self.requests, self.slo)
        with self._lock:
            rows = list(self.requests.values())
        classes: dict[str, list[dict[str, Any]]] = {"all": rows}
        for row in rows:
            classes.setdefault(row["cls"], []).append(row)
        span = _span(rows)
        out: dict[str, Any] = {"classes": {}, "span": span}
        for name, members in classes.items():
            completed = [r for r in members if r["finish"] is not None and not _failed(r)]
            entry: dict[str, Any] = {"num": len(members), "completed": len(completed)}
            for metric in ("ttft", "tpot", "e2e"):
                values = np.sort([r[metric] for r in completed if r[metric] is not None])
                entry[metric] = _cdf(values)
            if any(_slo_applies(r, self.slo) for r in members):
                met = sum(1 for r in completed if _meets_slo(r, self.slo))
                entry["slo_met"] = met
                entry["attainment"] = met / len(completed) if completed else None
                entry["goodput"] = met / span if span else None
            entry["throughput"] = len(completed) / span if span else None
            out["classes"][name] = entry
        out["slo"] = None if self.slo is None else {"ttft": self.slo.ttft, "tpot": self.slo.tpot}
        return out

    def request_list(self, sort: str = "stall", limit: int = 50) -> list[dict[str, Any]]:
        if sort not in ("stall", "e2e", "ttft", "preemptions", "arrival"):
            raise ValueError(f"cannot sort requests by {sort!r}")
        if isinstance(self.requests, RequestTable):  # what `key` below does, on the column
            values = np.nan_to_num(self.requests.column(sort), nan=0.0)
            order = np.argsort(values if sort == "arrival" else -values, kind="stable")
            return self.requests.rows(order[:limit])
        with self._lock:
            rows = list(self.requests.values())

        def key(r: dict[str, Any]) -> float:
            value = r.get(sort)
            return -(value or 0.0) if sort != "arrival" else value or 0.0

        return sorted(rows, key=key)[:limit]

    def request(self, request_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self.requests.get(request_id)
            if isinstance(self.events, EventTable):
                events = self.events.naming(request_id)
            else:
                events = [e for e in self.events if _names(e, request_id)]
        if row is None:
            if not events:
                return None
            row = _row_from_events(request_id, events)
        return explain_request(row, events)

    def markers(self, start: float | None, end: float | None, limit: int = 500) -> list[Any]:
        """Preemptions and evictions in a window (newest `limit`), for the timeline's marks."""
        lo = -np.inf if start is None else start
        hi = np.inf if end is None else end
        with self._lock:
            if isinstance(self.events, EventTable):
                return self.events.markers(lo, hi, limit)
            found = [
                e for e in self.events if e["k"] in ("preempt", "evict") and lo <= e["t"] <= hi
            ]
        return found[-limit:]


def _table_latency(table: RequestTable, slo: SLO | None) -> dict[str, Any]:
    """`ViewStore.latency` over a replay's columns (the same answer, without a dict a row)."""
    cls, cls_names = table.codes("cls")
    reason, reason_names = table.codes("reason")
    arrival, finish = table.column("arrival"), table.column("finish")
    failed_codes = [i for i, name in enumerate(reason_names) if name in FAILED_REASONS]
    completed = ~np.isnan(finish) & ~np.isin(reason, failed_codes)
    span = 0.0
    if (~np.isnan(arrival)).any() and (~np.isnan(finish)).any():
        span = max(0.0, float(np.nanmax(finish) - np.nanmin(arrival)))
    ttft, tpot = table.column("ttft"), table.column("tpot")
    ttft_slo, tpot_slo = table.column("ttft_slo"), table.column("tpot_slo")
    # _slo_applies and _meets_slo, per row: a row's own target first, then the run's.
    global_ttft = np.nan if slo is None or slo.ttft is None else slo.ttft
    global_tpot = np.nan if slo is None or slo.tpot is None else slo.tpot
    ttft_target = np.where(np.isnan(ttft_slo), global_ttft, ttft_slo)
    tpot_target = np.where(np.isnan(tpot_slo), global_tpot, tpot_slo)
    applies = ~np.isnan(ttft_slo) | ~np.isnan(tpot_slo)
    if slo is not None and (slo.ttft is not None or slo.tpot is not None):
        applies = np.ones(len(table), dtype=bool)
    with np.errstate(invalid="ignore"):
        misses = (~np.isnan(ttft_target) & (np.isnan(ttft) | (ttft > ttft_target))) | (
            ~np.isnan(tpot_target) & ~np.isnan(tpot) & (tpot > tpot_target)
        )
    meets = completed & ~misses
    out: dict[str, Any] = {"classes": {}, "span": span}
    members_of = {"all": np.ones(len(table), dtype=bool)}
    for code in dict.fromkeys(cls.tolist()):  # classes in order of first appearance
        name = cls_names[code] if code >= 0 else None
        if name is not None:
            members_of[name] = cls == code
    for name, members in members_of.items():
        done = members & completed
        entry: dict[str, Any] = {"num": int(members.sum()), "completed": int(done.sum())}
        for metric in ("ttft", "tpot", "e2e"):
            values = table.column(metric)[done]
            entry[metric] = _cdf(np.sort(values[~np.isnan(values)]))
        if applies[members].any():
            met = int((meets & members).sum())
            entry["slo_met"] = met
            entry["attainment"] = met / int(done.sum()) if done.any() else None
            entry["goodput"] = met / span if span else None
        entry["throughput"] = int(done.sum()) / span if span else None
        out["classes"][name] = entry
    out["slo"] = None if slo is None else {"ttft": slo.ttft, "tpot": slo.tpot}
    return out


def _names(event: dict[str, Any], request_id: str) -> bool:
    if event["k"] == "evict":
        return request_id in event["for"]
    return event.get("id") == request_id or request_id in (event.get("victim"), event.get("for"))


def _row_from_events(request_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A request still in flight: what its events say of it."""
    stalls = [e for e in events if e["k"] == "stall" and e["id"] == request_id]
    times = [e["t0"] for e in stalls] + [e["t"] for e in events if "t" in e]
    cls = next((e["cls"] for e in events if e.get("cls")), "default")
    return {
        "id": request_id,
        "cls": cls,
        "arrival": min(times) if times else 0.0,
        "finish": None,
        "first_token": None,
        "stall": sum(sum(e["sec"].values()) for e in stalls),
        "preemptions": sum(1 for e in events if e.get("victim") == request_id),
        "in_flight": True,
    }


def _cdf(values: np.ndarray) -> dict[str, list[float]]:
    """At most CDF_POINTS (value, fraction) points of the empirical CDF, ends included."""
    n = len(values)
    if n == 0:
        return {"x": [], "y": []}
    idx = np.unique(np.linspace(0, n - 1, min(n, CDF_POINTS)).astype(np.int64))
    return {
        "x": [round(float(v), 7) for v in values[idx]],
        "y": [round((i + 1) / n, 5) for i in idx],
    }


def _span(rows: list[dict[str, Any]]) -> float:
    arrivals = [r["arrival"] for r in rows if r["arrival"] is not None]
    finishes = [r["finish"] for r in rows if r["finish"] is not None]
    if not arrivals or not finishes:
        return 0.0
    return max(0.0, max(finishes) - min(arrivals))


def _failed(row: dict[str, Any]) -> bool:
    return row.get("reason") in FAILED_REASONS


def _slo_applies(row: dict[str, Any], slo: SLO | None) -> bool:
    return (
        row.get("ttft_slo") is not None
        or row.get("tpot_slo") is not None
        or (slo is not None and (slo.ttft is not None or slo.tpot is not None))
    )


def _meets_slo(row: dict[str, Any], slo: SLO | None) -> bool:
    """heddle.metrics.summary.meets_slo, on a compact row."""
    ttft_target, tpot_target = row.get("ttft_slo"), row.get("tpot_slo")
    if slo is not None:
        ttft_target = slo.ttft if ttft_target is None else ttft_target
        tpot_target = slo.tpot if tpot_target is None else tpot_target
    if ttft_target is not None and (row["ttft"] is None or row["ttft"] > ttft_target):
        return False
    return not (tpot_target is not None and row["tpot"] is not None and row["tpot"] > tpot_target)
