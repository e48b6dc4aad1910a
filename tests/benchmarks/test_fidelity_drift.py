"""benchmarks/fidelity_drift.py on a hand-made profile and step log: the thirds of a run, the
idle-gap filter, the split of the log into runs, and each run simulated at its own speed."""

from __future__ import annotations

import dataclasses

import pytest

from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.specs import load_model_spec

PRICES = {"constant": 0.01, "prefill_tokens": 1e-4, "decode_tokens": 1e-3}
DECODE = StepShape((), (10, 20))
CHUNK = StepShape(((32, 32),), (10,))

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def test_thirds_show_a_speed_that_moves_and_skip_idle_steps():
    import fidelity_drift

    price = ProfiledCostModel(PRICES)
    p_dec, p_chunk = price.step_time(DECODE), price.step_time(CHUNK)
    # 9 steps: the first third 1.2x slower than priced, then as priced; chunks at 0.5x.
    steps = [(DECODE, 1.2 * p_dec)] * 3 + [(DECODE, p_dec)] * 5 + [(CHUNK, 0.5 * p_chunk)]
    parts = fidelity_drift.ratios_by_part(steps, price)
    assert parts["decode"] == pytest.approx([1.2, 1.0, 1.0])
    assert parts["chunk"][:2] == [None, None] and parts["chunk"][2] == pytest.approx(0.5)
    gaps = [None, 1e-4, 1.9e-3, 2e-3, 0.5, 1e-4, 0.0, 1e-4, 1e-4]
    kept = fidelity_drift.back_to_back(steps, gaps)
    assert len(kept) == 6  # not the first step (no gap) nor those after >= 2 ms idle
    with pytest.raises(ValueError):
        fidelity_drift.back_to_back(steps, gaps[:-1])


def saved_case(measured: dict[str, float], runs: int, steps_per_run: int) -> dict[str, object]:
    import sim_fidelity

    shape = load_model_spec("smollm2-135m")
    rows = {m: {"measured": v, "predicted": v, "rel_error": 0.0} for m, v in measured.items()}
    case = {"workload": "chat", "rate": 2.0, "options": sim_fidelity.WORKLOADS["chat"],
            "runs": [{"rows": rows}] * runs, "run_steps": [steps_per_run] * runs}
    return {"budget": 256, "max_num_seqs": 8, "seed": 0, "num_blocks": 512,
            "max_model_len": 4096, "num_requests": 6, "model_shape": dataclasses.asdict(shape),
            "cases": [case]}  # fmt: skip


def test_own_speed_recovers_a_uniformly_slower_machine():
    import fidelity_drift
    import sim_fidelity

    from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from heddle.metrics import summarize
    from heddle.sim.simulator import build_sim_engine, simulate
    from heddle.workloads import get_workload

    cost = ProfiledCostModel(PRICES)
    # The "real" runs: this model's own simulation on a machine 1.3x slower.
    config = EngineConfig(model=ModelConfig(dtype="float32"), cache=CacheConfig(block_size=16),
                          scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8))
    workload = get_workload("chat", seed=0, num_requests=6, rate=2.0,
                            **sim_fidelity.WORKLOADS["chat"])  # fmt: skip
    sim = build_sim_engine(config, model=load_model_spec("smollm2-135m"),
                           cost_model=sim_fidelity.scaled(cost, 1.3), num_blocks=512,
                           max_model_len=4096)  # fmt: skip
    slow = summarize(simulate(workload, sim).records)
    measured = {m: sim_fidelity._summary_value(slow, m) for m in sim_fidelity.TARGET_FIGURES}
    saved = saved_case(measured, runs=2, steps_per_run=4)
    price = cost.executor_only().step_time(DECODE)
    steps = [(DECODE, 1.3 * price)] * 8  # every step 1.3x its price, no idle gap
    gaps: list[float | None] = [None, 0.0, 0.0, 0.0] * 2
    runs = fidelity_drift.split_runs(saved, steps, gaps)
    assert [len(s) for s, _ in runs[0]] == [4, 4]
    speeds, errors = fidelity_drift.own_speed(saved, cost, saved["cases"][0], runs[0])
    assert speeds == pytest.approx([1.3, 1.3])
    assert all(abs(e) < 1e-9 for e in errors.values())
    # Priced at the profile's own speed the same runs are off (the simulation is too fast).
    runs_fast = fidelity_drift.split_runs(saved, [(DECODE, price)] * 8, gaps)
    _, off = fidelity_drift.own_speed(saved, cost, saved["cases"][0], runs_fast[0])
    assert off["tpot p50"] < -0.2
    with pytest.raises(ValueError, match="count"):
        fidelity_drift.split_runs(saved, steps[:7], gaps[:7])
