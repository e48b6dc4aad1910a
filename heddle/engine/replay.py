"""Drive an Engine with a workload: the event loop shared by the simulator and real replays.

Events are request arrivals, step ends and (for agent workloads) tool returns, which are just
arrivals caused by a finished call:

    admit every arrival with time <= now          (ties: arrivals at a step's end join the
    if anything is unfinished: engine.step()       next step, in workload order)
    else: clock.wait_until(next arrival)

With a VirtualClock and a SimulatedExecutor this is the simulator (the executor advances the
clock by its cost model's step time; waiting jumps). With a WallClock and the ModelExecutor it
replays the same arrivals on the real model in real time (waiting sleeps). Same code, so a
simulated result is a statement about the real system.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.engine.engine import Engine
from heddle.errors import HeddleError
from heddle.metrics.programs import ProgramRecord
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepLog
from heddle.request import SamplingParams
from heddle.structured.spec import GrammarSpec
from heddle.workloads import AgentRun, TokenContexts, Workload, WorkloadRequest

# A constrained workload request decodes under this grammar: on the real engine the output is a
# JSON object (it may stop before its output_len); the simulator charges its rows' mask work.
_JSON_OBJECT = GrammarSpec.json_object()


@dataclass(slots=True)
class ReplayResult:
    records: list[RequestRecord]
    step_stats: StepLog
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (request id, reason)
    start_time: float = 0.0  # the engine clock's time of the workload's t=0
    elapsed: float = 0.0  # engine-clock seconds from start to the last finish
    wall_seconds: float = 0.0
    num_steps: int = 0
    num_preemptions: int = 0
    num_blocks: int = 0
    engine: Engine | None = None
    programs: list[ProgramRecord] = field(default_factory=list)  # agent workloads: per program
    cut: bool = False  # stopped at `until` with requests in flight (aborted), not drained

    @property
    def requests_per_wall_second(self) -> float:
        return len(self.records) / self.wall_seconds if self.wall_seconds else 0.0


def replay(
    engine: Engine,
    workload: Workload,
    *,
    vocab_size: int,
    temperature: float = 0.0,
    progress: bool = False,
    until: float | None = None,
) -> ReplayResult:
    """Run every request of `workload` through `engine` at its arrival time (engine clock).

    `until` (seconds after the workload's t=0): stop there instead of draining; requests still
    in flight are aborted (records with finish_reason "abort", `ReplayResult.cut` set), and
    arrivals after it are never added. For steady-state measurements that do not count the
    drain (heddle/metrics/steady.py): under sustained overload the drain is most of the run."""
    clock = engine.clock
    start = clock.now()
    # Agent programs: a finished call causes the next ones (after a tool, or a fan-out/join).
    agents = AgentRun(workload, TokenContexts(vocab_size)) if workload.is_agent else None
    first = agents.first_requests() if agents is not None else workload.requests
    # Arrivals by (time, order of creation): ties between equal times keep workload order.
    events = _Arrivals(start, first)
    next_order = len(first)
    in_flight: dict[str, WorkloadRequest] = {}
    result = ReplayResult(records=[], step_stats=StepLog(), start_time=start, engine=engine)
    bar = _Progress(len(workload.flat())) if progress else None
    wall_start = time.perf_counter()
    records_before = len(engine.finished_records)

    stop = None if until is None else start + until
    while events or engine.has_unfinished_requests():
        now = clock.now()
        while events.next_at <= now:
            arrival, request = events.pop()
            prompt_ids = list(
                agents.context_of(request) if agents is not None else request.prompt_ids(vocab_size)
            )
            try:
                engine.add_request(
                    request.request_id,
                    prompt_ids,
                    SamplingParams(
                        max_tokens=request.output_len, temperature=temperature, ignore_eos=True
                    ),
                    arrival_time=arrival,
                    priority=request.priority,
                    user=request.user,
                    request_class=request.request_class,
                    ttft_slo=request.ttft_slo,
                    tpot_slo=request.tpot_slo,
                    true_output_len=request.output_len,
                    **session_fields(request),
                    true_thinking_len=request.thinking_len or None,
                    grammar=_JSON_OBJECT if request.constrained else None,
                )
            except HeddleError as exc:
                result.rejected.append((request.request_id, str(exc)))
                if agents is not None:
                    agents.failed(request, arrival - start)
                continue
            in_flight[request.request_id] = request
        if stop is not None and now >= stop:
            result.cut = bool(in_flight)
            for request_id in list(in_flight):
                engine.abort_request(request_id)
            in_flight.clear()
            break
        if not engine.has_unfinished_requests():
            if events:
                clock.wait_until(events.next_time())
            continue
        steps_before = engine.num_steps
        outputs = engine.step()
        if engine.num_steps == steps_before:
            if not events:
                raise RuntimeError("the scheduler can run nothing and no event is pending")
            clock.wait_until(events.next_time())
            continue
        for output in outputs:
            if not output.finished:
                continue
            request = in_flight.pop(output.request_id)
            if bar is not None:
                bar.advance()
            record = output.metrics
            if agents is not None and record is not None and record.finish_time is not None:
                for follow_up in agents.finished(
                    request, record.finish_time - start, output.outputs[0].token_ids
                ):
                    events.push(start + follow_up.arrival_time, next_order, follow_up)
                    next_order += 1

    if bar is not None:
        bar.close()
    result.wall_seconds = time.perf_counter() - wall_start
    result.records = engine.finished_records[records_before:]
    result.step_stats = engine.step_stats
    result.elapsed = clock.now() - start
    result.num_steps = engine.num_steps
    result.num_preemptions = engine.scheduler.num_preemptions
    result.num_blocks = engine.kv_cache.num_blocks
    if agents is not None:
        result.programs = agents.program_records()
    engine.check_integrity()
    engine.scheduler.sessions.release_all()  # what a failed program left parked
    engine.check_integrity()
    return result


class _Arrivals:
    """The pending arrivals in (time, order of creation) order: the workload's own requests
    read in place when they are in time order (a heap of a million tuples costs ~100 MB and
    seconds), and a heap for the rest (follow-up calls of agent programs, or a workload whose
    requests are not sorted by arrival)."""

    def __init__(self, start: float, requests: Sequence[WorkloadRequest]) -> None:
        self._start = start
        in_order = all(a.arrival_time <= b.arrival_time for a, b in itertools.pairwise(requests))
        self._list: Sequence[WorkloadRequest] = requests if in_order else ()
        self._next = 0
        self._heap: list[tuple[float, int, WorkloadRequest]] = []
        if not in_order:
            self._heap = [(start + r.arrival_time, i, r) for i, r in enumerate(requests)]
            heapq.heapify(self._heap)
        # The next event's time (inf: none), kept as events come and go: the loop reads it
        # once per step.
        self.next_at = math.inf
        self._refresh()

    def _refresh(self) -> None:
        self.next_at = self.next_time() if self else math.inf

    def __bool__(self) -> bool:
        return self._next < len(self._list) or bool(self._heap)

    def _from_list(self) -> bool:
        """Is the next event the list's? (Ties go to the lower order: the list's.)"""
        if self._next >= len(self._list):
            return False
        if not self._heap:
            return True
        time = self._start + self._list[self._next].arrival_time
        return (time, self._next) < self._heap[0][:2]

    def next_time(self) -> float:
        if self._from_list():
            return self._start + self._list[self._next].arrival_time
        return self._heap[0][0]

    def pop(self) -> tuple[float, WorkloadRequest]:
        if self._from_list():
            request = self._list[self._next]
            self._next += 1
            self._refresh()
            return self._start + request.arrival_time, request
        time, _, request = heapq.heappop(self._heap)
        self._refresh()
        return time, request

    def push(self, time: float, order: int, request: WorkloadRequest) -> None:
        heapq.heappush(self._heap, (time, order, request))
        self._refresh()


def session_fields(request: WorkloadRequest) -> dict[str, Any]:
    """Engine.add_request's session arguments for an agent program's call (none otherwise)."""
    if request.program_id is None:
        return {}
    return {
        "session_id": request.program_id,
        "parent_session_id": request.parent_program_id,
        "expected_pause": request.expected_pause,
        "close_session": request.last_call,
        "tool": request.tool,
    }


class _Progress:
    """A rich progress bar over finished requests."""

    def __init__(self, total: int) -> None:
        from rich.progress import Progress

        self._progress = Progress()
        self._task = self._progress.add_task("requests", total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.update(self._task, advance=1)

    def close(self) -> None:
        self._progress.stop()
