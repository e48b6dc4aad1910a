"""`summarize(records)`: latency, throughput and goodput, per request class and overall."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from heddle.metrics.record import RequestRecord, itl_counts
from heddle.metrics.stats import LatencyStats

FAILED_REASONS = frozenset({"abort", "error"})
OVERALL = "all"
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "queue_time", "stall_time", "blocked_time")


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets in seconds; None leaves a metric unconstrained."""

    ttft: float | None = None
    tpot: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SLO {name} must be positive, got {value}")


def slo_applies(record: RequestRecord, slo: SLO | None) -> bool:
    """Whether any latency target constrains this request."""
    return (
        record.ttft_slo is not None
        or record.tpot_slo is not None
        or (slo is not None and (slo.ttft is not None or slo.tpot is not None))
    )


def meets_slo(record: RequestRecord, slo: SLO | None) -> bool:
    """ttft <= ttft target and tpot <= tpot target; a request's own targets override `slo`.

    An unconstrained metric always passes; so does TPOT for a one-token output. A request that
    never produced a token fails a TTFT target.
    """
    ttft_target, tpot_target = record.ttft_slo, record.tpot_slo
    if slo is not None:
        ttft_target = slo.ttft if ttft_target is None else ttft_target
        tpot_target = slo.tpot if tpot_target is None else tpot_target
    if ttft_target is not None:
        ttft = record.ttft
        if ttft is None or ttft > ttft_target:
            return False
    if tpot_target is not None:
        tpot = record.tpot
        if tpot is not None and tpot > tpot_target:
            return False
    return True


def is_failed(record: RequestRecord) -> bool:
    return record.finish_reason in FAILED_REASONS


def is_completed(record: RequestRecord) -> bool:
    return record.finish_time is not None and not is_failed(record)


@dataclass(slots=True)
class ClassSummary:
    """One row of a report: the requests of one class (or all of them).

    Latencies and token counts cover completed requests (finished, not aborted or failed);
    throughputs divide them by the run's duration, so class throughputs add up to the overall.
    Goodput is completed requests within their SLO per second; None when no SLO was set.
    """

    request_class: str
    num_requests: int
    num_completed: int
    num_failed: int
    num_unfinished: int
    num_preemptions: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    num_within_slo: int | None
    goodput: float | None
    ttft: LatencyStats = field(default_factory=LatencyStats)
    tpot: LatencyStats = field(default_factory=LatencyStats)
    itl: LatencyStats = field(default_factory=LatencyStats)
    e2e: LatencyStats = field(default_factory=LatencyStats)
    queue_time: LatencyStats = field(default_factory=LatencyStats)
    stall_time: LatencyStats = field(default_factory=LatencyStats)
    blocked_time: LatencyStats = field(default_factory=LatencyStats)  # blocked_by_longer_time
    # Mean over completed requests of the mean utilization (tokens / budget) of their steps.
    step_utilization: float | None = None

    @property
    def slo_attainment(self) -> float | None:
        """Share of completed requests within their SLO."""
        if self.num_within_slo is None or self.num_completed == 0:
            return None
        return self.num_within_slo / self.num_completed

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, LatencyStats) else value
        out["slo_attainment"] = self.slo_attainment
        return out


@dataclass(slots=True)
class Summary:
    duration: float  # seconds the throughputs are divided by
    overall: ClassSummary
    classes: dict[str, ClassSummary]  # by request class, sorted by name
    slo: SLO | None = None

    def to_dict(self) -> dict[str, Any]:
        slo = None if self.slo is None else {"ttft": self.slo.ttft, "tpot": self.slo.tpot}
        return {
            "duration": self.duration,
            "slo": slo,
            "overall": self.overall.to_dict(),
            "classes": {name: c.to_dict() for name, c in self.classes.items()},
        }


def run_span(records: Iterable[RequestRecord]) -> float:
    """From the first arrival to the last finish (or last token, for unfinished requests)."""
    start, end = math.inf, -math.inf
    for r in records:
        start = min(start, r.arrival_time)
        last = r.finish_time if r.finish_time is not None else r.last_token_time
        if last is not None:
            end = max(end, last)
    return max(0.0, end - start) if end > -math.inf else 0.0


def summarize(
    records: Sequence[RequestRecord], duration: float | None = None, slo: SLO | None = None
) -> Summary:
    """Summarize a run: per request class and overall (class "all").

    `duration` defaults to the run's span (first arrival to last finish).
    """
    if duration is None:
        duration = run_span(records)
    if duration < 0:
        raise ValueError(f"duration must be >= 0, got {duration}")
    with_slo = any(slo_applies(r, slo) for r in records)
    by_class: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_class.setdefault(r.request_class, []).append(r)
    classes = {
        name: _summarize_class(name, by_class[name], duration, slo, with_slo)
        for name in sorted(by_class)
    }
    if len(classes) == 1:
        # One class: its records are all the records, in the same order, so the overall
        # figures are the same numbers (summarizing a million records twice costs seconds).
        (only,) = classes.values()
        overall = replace(only, request_class=OVERALL)
    else:
        overall = _summarize_class(OVERALL, records, duration, slo, with_slo)
    return Summary(duration=duration, overall=overall, classes=classes, slo=slo)


def _summarize_class(
    name: str,
    records: Sequence[RequestRecord],
    duration: float,
    slo: SLO | None,
    with_slo: bool,
) -> ClassSummary:
    completed = [r for r in records if is_completed(r)]
    num_failed = sum(1 for r in records if is_failed(r))
    prompt_tokens = sum(r.num_prompt_tokens for r in completed)
    output_tokens = sum(r.num_output_tokens for r in completed)
    within = sum(1 for r in completed if meets_slo(r, slo)) if with_slo else None

    def rate(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    return ClassSummary(
        request_class=name,
        num_requests=len(records),
        num_completed=len(completed),
        num_failed=num_failed,
        num_unfinished=len(records) - len(completed) - num_failed,
        num_preemptions=sum(r.num_preemptions for r in records),
        num_prompt_tokens=prompt_tokens,
        num_output_tokens=output_tokens,
        num_cached_tokens=sum(r.num_cached_tokens for r in completed),
        request_throughput=rate(len(completed)),
        output_throughput=rate(output_tokens),
        total_token_throughput=rate(prompt_tokens + output_tokens),
        num_within_slo=within,
        goodput=None if within is None else rate(within),
        ttft=LatencyStats.of(r.ttft for r in completed),
        tpot=LatencyStats.of(r.tpot for r in completed),
        itl=LatencyStats.of_counts(*itl_counts(completed)),
        e2e=LatencyStats.of(r.e2e for r in completed),
        queue_time=LatencyStats.of(r.queue_time for r in completed),
        stall_time=LatencyStats.of(r.stall_time for r in completed),
        blocked_time=LatencyStats.of(r.blocked_by_longer_time for r in completed),
        step_utilization=_mean(
            [u for r in completed if (u := r.step_utilization) is not None]
        ),
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
