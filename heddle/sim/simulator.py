"""The simulator's event loop: the real Engine, Scheduler and policies on a virtual clock.

Events are request arrivals, step ends and (for agent workloads) tool returns, which are just
arrivals caused by a finished call. The loop is:

    admit every arrival with time <= now          (ties: arrivals at a step's end join the
    if anything is unfinished: engine.step()       next step, in workload order)
        (the SimulatedExecutor advances the clock by the cost model's step time)
    else: jump the clock to the next arrival

Only the executor and the clock differ from a real run, so what the simulator says about a
policy is a statement about the real scheduler.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import EngineConfig
from heddle.engine.engine import Engine
from heddle.errors import HeddleError
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat
from heddle.request import SamplingParams
from heddle.workloads import Workload, WorkloadRequest

SIM_EOS_TOKEN_ID = 2


@dataclass(slots=True)
class SimulationResult:
    records: list[RequestRecord]
    step_stats: list[StepStat]
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (request id, reason)
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    num_steps: int = 0
    num_preemptions: int = 0
    num_blocks: int = 0
    engine: Engine | None = None

    @property
    def requests_per_wall_second(self) -> float:
        return len(self.records) / self.wall_seconds if self.wall_seconds else 0.0


def simulate(
    workload: Workload,
    config: EngineConfig,
    executor_factory: Callable[[VirtualClock], Any],
    *,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int | None = None,
    record_steps: bool = True,
    progress: bool = False,
) -> SimulationResult:
    """Run `workload` through a fresh Engine whose executor `executor_factory(clock)` builds."""
    clock = VirtualClock()
    engine = Engine(
        config,
        executor_factory(clock),
        num_blocks=num_blocks,
        clock=clock,
        eos_token_id=SIM_EOS_TOKEN_ID,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        record_steps=record_steps,
        final_outputs_only=True,
    )
    # (arrival time, order of creation, request): ties between equal times keep workload order.
    events: list[tuple[float, int, WorkloadRequest]] = [
        (r.arrival_time, i, r) for i, r in enumerate(workload.requests)
    ]
    heapq.heapify(events)
    next_order = len(events)
    in_flight: dict[str, tuple[WorkloadRequest, list[int]]] = {}
    result = SimulationResult(records=[], step_stats=[], engine=engine, num_blocks=num_blocks)
    total = len(workload.flat())
    bar = _Progress(total) if progress else None
    started = time.perf_counter()

    while events or engine.has_unfinished_requests():
        now = clock.now()
        while events and events[0][0] <= now:
            _, _, request = heapq.heappop(events)
            prompt_ids = list(request.prompt_ids(vocab_size))
            try:
                engine.add_request(
                    request.request_id,
                    prompt_ids,
                    SamplingParams(max_tokens=request.output_len, temperature=0.0),
                    arrival_time=request.arrival_time,
                    priority=request.priority,
                    user=request.user,
                    request_class=request.request_class,
                    ttft_slo=request.ttft_slo,
                    tpot_slo=request.tpot_slo,
                    true_output_len=request.output_len,
                )
            except HeddleError as exc:
                result.rejected.append((request.request_id, str(exc)))
                continue
            in_flight[request.request_id] = (request, prompt_ids)
        if not engine.has_unfinished_requests():
            if events:
                clock.advance_to(events[0][0])
            continue
        steps_before = engine.num_steps
        outputs = engine.step()
        if engine.num_steps == steps_before:
            if not events:
                raise RuntimeError("the scheduler can run nothing and no event is pending")
            clock.advance_to(max(events[0][0], clock.now()))
            continue
        for output in outputs:
            if not output.finished:
                continue
            request, prompt_ids = in_flight.pop(output.request_id)
            if bar is not None:
                bar.advance()
            record = output.metrics
            if workload.is_agent and record is not None and record.finish_time is not None:
                follow_up = workload.next_request(
                    request,
                    record.finish_time,
                    vocab_size=vocab_size,
                    prompt_token_ids=prompt_ids,
                    output_token_ids=output.outputs[0].token_ids,
                )
                if follow_up is not None:
                    heapq.heappush(events, (follow_up.arrival_time, next_order, follow_up))
                    next_order += 1

    if bar is not None:
        bar.close()
    result.wall_seconds = time.perf_counter() - started
    result.records = engine.finished_records
    result.step_stats = engine.step_stats
    result.virtual_seconds = clock.now()
    result.num_steps = engine.num_steps
    result.num_preemptions = engine.scheduler.num_preemptions
    engine.check_integrity()
    return result


class _Progress:
    """A rich progress bar over finished requests."""

    def __init__(self, total: int) -> None:
        from rich.progress import Progress

        self._progress = Progress()
        self._task = self._progress.add_task("simulating", total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.update(self._task, advance=1)

    def close(self) -> None:
        self._progress.stop()
