"""Program-level reports of agent workloads: one ProgramRecord per root program.

A program (an agent's session, its sub-agents included) completes when its last call finishes;
its completion time counts every call, queue, tool pause and join on the way. Per-turn numbers
(TTFT of each LLM call, prefix-cache hits) come from the calls' RequestRecords.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from heddle.metrics.record import RequestRecord
from heddle.metrics.stats import percentile
from heddle.metrics.summary import is_completed


@dataclass(slots=True)
class ProgramRecord:
    """One root program: when it started, when its last call finished, what it ran."""

    program_id: str
    arrival_time: float  # its first call's arrival (seconds, the run's clock)
    request_class: str = "agent"
    finish_time: float | None = None
    num_calls: int = 0  # LLM calls that finished, its sub-agents' included
    num_subagents: int = 0
    tool_time: float = 0.0  # seconds its main thread waited on tools and sub-agents
    failed: bool = False

    @property
    def completion_time(self) -> float | None:
        if self.finish_time is None or self.failed:
            return None
        return self.finish_time - self.arrival_time


@dataclass(frozen=True, slots=True)
class TailStats:
    """mean, p50, p95, p99 and max of one metric (seconds); None where there were no values."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> TailStats:
        present = sorted(v for v in values if v is not None)
        if not present:
            return cls()
        return cls(
            count=len(present),
            mean=math.fsum(present) / len(present),
            p50=percentile(present, 50),
            p95=percentile(present, 95),
            p99=percentile(present, 99),
            max=present[-1],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ProgramSummary:
    num_programs: int
    num_completed: int
    num_failed: int
    num_calls: int  # LLM calls that completed
    duration: float  # seconds the throughput is divided by
    program_throughput: float  # completed programs per second
    completion_time: TailStats  # per completed program
    turn_ttft: TailStats  # per completed LLM call
    num_prompt_tokens: int  # over completed calls
    num_cached_tokens: int  # of those, served by the prefix cache (as the server reports)
    cache_hit_rate: float | None  # None: the server reported no cached tokens
    tool_time: TailStats  # per completed program: seconds spent waiting on tools

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, TailStats) else value
        return out


def summarize_programs(
    programs: Sequence[ProgramRecord],
    records: Sequence[RequestRecord],
    *,
    duration: float | None = None,
    cache_reported: bool = True,
) -> ProgramSummary:
    """Summarize the programs of a run and the calls they made. `duration` defaults to the
    span from the first program's start to the last program's finish."""
    done = [p for p in programs if p.completion_time is not None]
    if duration is None:
        ends = [p.finish_time for p in programs if p.finish_time is not None]
        starts = [p.arrival_time for p in programs]
        duration = max(ends) - min(starts) if ends and starts else 0.0
    calls = [r for r in records if is_completed(r)]
    prompt = sum(r.num_prompt_tokens for r in calls)
    cached = sum(r.num_cached_tokens for r in calls)
    return ProgramSummary(
        num_programs=len(programs),
        num_completed=len(done),
        num_failed=sum(1 for p in programs if p.failed),
        num_calls=len(calls),
        duration=duration,
        program_throughput=len(done) / duration if duration > 0 else 0.0,
        completion_time=TailStats.of(p.completion_time for p in done),
        turn_ttft=TailStats.of(r.ttft for r in calls),
        num_prompt_tokens=prompt,
        num_cached_tokens=cached,
        cache_hit_rate=cached / prompt if cache_reported and prompt else None,
        tool_time=TailStats.of(p.tool_time for p in done),
    )


def format_program_summary(summary: ProgramSummary, title: str = "programs") -> str:
    """A few lines of text for a terminal or a log."""

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    c, t = summary.completion_time, summary.turn_ttft
    hit = "not reported" if summary.cache_hit_rate is None else f"{summary.cache_hit_rate:.1%}"
    return "\n".join(
        [
            f"{title}: {summary.num_completed}/{summary.num_programs} completed, "
            f"{summary.num_failed} failed, {summary.num_calls} calls, "
            f"{summary.program_throughput:.3f} programs/s over {summary.duration:.1f} s",
            f"  program completion time (s): mean {s(c.mean)} p50 {s(c.p50)} "
            f"p95 {s(c.p95)} p99 {s(c.p99)} max {s(c.max)}",
            f"  per-turn TTFT (s): mean {s(t.mean)} p50 {s(t.p50)} p95 {s(t.p95)} p99 {s(t.p99)}",
            f"  prefix-cache hits: {hit} of {summary.num_prompt_tokens} prompt tokens; "
            f"tool wait per program mean {s(summary.tool_time.mean)} s",
        ]
    )
