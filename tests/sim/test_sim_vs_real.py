"""The simulator is the real engine: same decisions as a wall-clock run, and Orca's result."""

from __future__ import annotations

import time

from heddle.clock import VirtualClock, WallClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.metrics import summarize
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.simulator import SIM_EOS_TOKEN_ID, sim_engine, simulate
from heddle.workloads import Workload, WorkloadRequest, get_workload

VOCAB = 1000


class LinearCost(CostModel):
    """A known, exact cost: a base plus a little per token."""

    def step_time(self, shape: StepShape) -> float:
        return 0.1 + 0.0002 * shape.num_tokens

    def describe(self) -> str:
        return "linear test cost"


class SleepingExecutor:
    """Real time: sleeps for the cost model's step time, samples like the SimulatedExecutor."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.tokens = SimulatedExecutor(cost, VirtualClock(), vocab_size=VOCAB)
        self._end: float | None = None

    def execute(self, so: SchedulerOutput) -> ExecutorOutput:
        seconds = self.cost.step_time(StepShape.from_scheduler_output(so))
        now = time.monotonic()
        # A step that follows the last one back to back starts where that one was due to end,
        # so the engine's own time between steps (a few ms, more on a loaded machine) does not
        # add up over the run; after an idle wait it starts now, as the simulated step does.
        back_to_back = self._end is not None and now - self._end < 0.02
        start = self._end if back_to_back and self._end is not None else now
        self._end = start + seconds
        time.sleep(max(0.0, self._end - time.monotonic()))
        return self.tokens.execute(so)  # the same tokens and duration (its own clock, unread)


def small_workload() -> Workload:
    # Steps take ~100-105 ms and every arrival is at least 30 ms from a step boundary (checked
    # below), so the wall-clock run's jitter and overhead cannot move one across a boundary.
    requests = [
        WorkloadRequest(f"r{i}", arrival, prompt_len=8 + 5 * i, output_len=3 + (i * 7) % 11)
        for i, arrival in enumerate([0.0, 0.0, 0.05, 0.25, 0.36, 0.75, 0.76, 1.15])
    ]
    return Workload(name="hand", params={}, seed=0, requests=requests)


def config() -> EngineConfig:
    return EngineConfig(
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4),
    )


def run_wall_clock(workload: Workload, cost: CostModel) -> list[list[str]]:
    """The same replay loop the simulator uses, on a wall clock with a sleeping executor."""
    engine = Engine(
        config(),
        SleepingExecutor(cost),
        num_blocks=64,
        clock=WallClock(),
        eos_token_id=SIM_EOS_TOKEN_ID,
        vocab_size=VOCAB,
        record_step_requests=True,
    )
    replay(engine, workload, vocab_size=VOCAB)
    return [s.request_ids for s in engine.step_stats]


def test_simulated_and_wall_clock_runs_make_the_same_decisions():
    workload, cost = small_workload(), LinearCost()
    engine = sim_engine(
        config(),
        lambda clock: SimulatedExecutor(cost, clock, vocab_size=VOCAB),
        num_blocks=64,
        vocab_size=VOCAB,
        record_step_requests=True,
    )
    simulated = simulate(workload, engine)
    sim_batches = [s.request_ids for s in simulated.step_stats]
    assert len(sim_batches) > 10
    boundaries = [s.start_time for s in simulated.step_stats]
    for r in workload.requests[2:]:
        assert min(abs(r.arrival_time - b) for b in boundaries) > 0.03, r.request_id
    assert run_wall_clock(workload, cost) == sim_batches


def test_iteration_level_batching_beats_request_level_by_a_wide_margin():
    """Orca (OSDI'22): on mixed output lengths, static batches wait for their longest member."""
    workload = get_workload(
        "random",
        num_requests=64,
        rate=float("inf"),
        seed=3,
        input_len=64,
        output_len=256,
        range_ratio=0.95,
    )
    results = {}
    for policy in ("fcfs", "static"):
        cfg = EngineConfig(
            cache=CacheConfig(block_size=16),
            scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=16, policy=policy),
        )
        engine = sim_engine(
            cfg,
            lambda clock: SimulatedExecutor(LinearCost(), clock, vocab_size=VOCAB),
            num_blocks=2048,
            vocab_size=VOCAB,
        )
        run = simulate(workload, engine)
        results[policy] = summarize(run.records)
    fcfs, static = results["fcfs"].overall, results["static"].overall
    assert fcfs.num_completed == static.num_completed == 64
    assert fcfs.output_throughput > 1.5 * static.output_throughput
    assert static.e2e.mean > 1.5 * fcfs.e2e.mean
