"""Grammar-constrained requests in the simulator: a step's constrained sampling rows cost the
cost model's per-row term (profiled `constrained_rows`, roofline `grammar_row_seconds`); a
workload marks a share of its requests constrained; 0 constrained rows change nothing."""

from __future__ import annotations

import math

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.errors import HeddleError
from heddle.sim.cost_model import StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import CONSTRAINED_ROWS, ProfiledCostModel
from heddle.sim.registry import make_cost_model
from heddle.sim.roofline import RooflineCostModel
from heddle.workloads import Workload, WorkloadRequest, get_workload

ROW = 5e-4
COST = ProfiledCostModel({"constant": 1e-3, "decode_tokens": 1e-4, CONSTRAINED_ROWS: ROW})


def sim_engine(cost) -> Engine:
    clock = VirtualClock()
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=256),
                          scheduler=SchedulerConfig(max_num_seqs=8))
    return Engine(config, SimulatedExecutor(cost, clock, vocab_size=1000), num_blocks=256,
                  clock=clock, eos_token_id=0, vocab_size=1000)


def test_constrained_rows_cost_their_term_and_none_cost_nothing():
    free = StepShape((), (10, 20, 30))
    shape = StepShape((), (10, 20, 30), num_constrained=2)
    assert COST.step_time(shape) == pytest.approx(COST.step_time(free) + 2 * ROW)
    assert StepShape.from_totals((), 3, 60, 3, 2) == shape and shape != free
    with pytest.raises(ValueError, match="num_constrained"):
        StepShape((), (10,), num_constrained=2)  # more constrained rows than sampled ones
    roofline = RooflineCostModel("llama-3.1-8b", "h100", grammar_row_seconds=1e-4)
    base = RooflineCostModel("llama-3.1-8b", "h100", grammar_row_seconds=0.0)
    decode = StepShape((), (100,) * 4)
    assert roofline.step_time(decode) == base.step_time(decode)  # exactly: 0 rows, 0 seconds
    three = StepShape((), (100,) * 4, num_constrained=3)
    assert roofline.step_time(three) == pytest.approx(base.step_time(decode) + 3e-4)
    assert roofline.operator_times(three)["grammar"] == pytest.approx(3e-4)
    assert math.isclose(sum(roofline.operator_times(three).values()), roofline.step_time(three))
    assert make_cost_model("roofline", model="llama-3.1-8b", hardware="h100",
                           grammar_row_seconds=2e-4).step_time(three) > roofline.step_time(three)
    with pytest.raises(HeddleError, match="grammar_row_seconds"):
        RooflineCostModel("llama-3.1-8b", "h100", grammar_row_seconds=-1.0)


def test_the_profile_term_is_saved_and_old_profiles_charge_nothing(tmp_path):
    path = tmp_path / "p.json"
    COST.with_constrained_row_seconds(2 * ROW, measured={"rows": 8}).save(path)
    loaded = ProfiledCostModel.load(path)
    assert loaded.constrained_row_seconds == 2 * ROW
    assert loaded.metadata.extra["constrained_row"] == {"rows": 8}
    old = ProfiledCostModel({"constant": 1e-3, "decode_tokens": 1e-4})  # no such coefficient
    shape = StepShape((), (10, 20), num_constrained=2)
    assert old.step_time(shape) == old.step_time(StepShape((), (10, 20)))


def requests(constrained: bool) -> Workload:
    reqs = [WorkloadRequest(f"r{i}", 0.0, prompt_len=8, output_len=5,
                            constrained=constrained and i % 2 == 0)
            for i in range(4)]
    return Workload("w", {}, 0, reqs)


def test_a_simulated_run_pays_for_its_constrained_rows():
    free = replay(sim_engine(COST), requests(False), vocab_size=1000)
    engine = sim_engine(COST)
    seen: list[int] = []
    execute = engine.executor.execute

    def spy(scheduler_output):
        seen.append(scheduler_output.num_constrained)
        return execute(scheduler_output)

    engine.executor.execute = spy  # type: ignore[method-assign]
    mixed = replay(engine, requests(True), vocab_size=1000)
    # Two constrained requests sample five tokens each: ten constrained rows in all.
    assert sum(seen) == 10
    assert sum(s.duration for s in mixed.step_stats) == pytest.approx(
        sum(s.duration for s in free.step_stats) + 10 * ROW
    )
    assert not engine._unmasked_grammars  # forgotten as each finished
    engine.check_integrity()


def test_the_constrained_workload_option_marks_a_share_by_seed():
    def marked(share, seed=0):
        w = get_workload("chat", num_requests=400, seed=seed, constrained=share)
        return [r.request_id for r in w.requests if r.constrained], w

    none, _ = marked(0.0)
    some, workload = marked(0.25)
    assert none == [] and 70 < len(some) < 130
    assert workload.describe()["params"]["constrained"] == 0.25
    assert marked(0.25)[0] == some and marked(0.25, seed=1)[0] != some
    assert len(marked(1.0)[0]) == 400
    row = next(r for r in workload.requests if r.constrained)
    assert WorkloadRequest.from_dict(row.to_dict()).constrained
    with pytest.raises(HeddleError, match="share"):
        get_workload("chat", num_requests=4, constrained=1.5)
    with pytest.raises(HeddleError, match="agent workload"):
        get_workload("agent", num_requests=4, constrained=0.5)
