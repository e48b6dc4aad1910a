"""benchmarks/fidelity_load.py and sim_fidelity.py's stall count, on a hand-made profile: the
stall a disturbed cost model injects, the capacity it finds, and the stalls found in a log."""

from __future__ import annotations

import dataclasses

import pytest

from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.specs import load_model_spec

PRICES = {"constant": 0.01, "prefill_tokens": 1e-4, "decode_tokens": 1e-3}


pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def saved_run() -> dict[str, object]:
    """What sim_fidelity.py saves that fidelity_load.py reads to rebuild the engine."""
    shape = load_model_spec("smollm2-135m")
    return {"budget": 256, "max_num_seqs": 8, "seed": 0, "num_blocks": 512,
            "max_model_len": 4096, "model_shape": dataclasses.asdict(shape)}  # fmt: skip


def test_disturbed_stalls_exactly_the_chosen_steps():
    import fidelity_load

    base = ProfiledCostModel(PRICES)
    decode = StepShape((), (10, 20))
    model = fidelity_load.Disturbed(base, stall_at=2, stall_steps=3, stall_seconds=0.5)
    times = [model.step_time(decode) for _ in range(7)]
    price = base.step_time(decode)
    assert times == pytest.approx([price, price] + [price + 0.5] * 3 + [price, price])
    assert model.step_time(StepShape()) == 0.0  # an empty step is no step
    noisy = [fidelity_load.Disturbed(base, noise=0.1, seed=3) for _ in range(2)]
    first, second = ([m.step_time(decode) for _ in range(20)] for m in noisy)
    assert first == second and len(set(first)) == 20  # seeded, and it does vary


def test_capacity_halves_when_every_step_costs_double():
    import fidelity_load

    saved = saved_run()
    options = {"length_scale": 0.1}
    cheap = fidelity_load.capacity(saved, ProfiledCostModel(PRICES), "chat", options, [40])
    dear = fidelity_load.capacity(
        saved, ProfiledCostModel({k: 2 * v for k, v in PRICES.items()}), "chat", options, [40]
    )
    assert cheap[0] > 0
    assert dear[0] == pytest.approx(cheap[0] / 2, rel=1e-6)


def test_stalls_counts_steps_far_over_their_price():
    import sim_fidelity

    cost = ProfiledCostModel(PRICES)
    decode = StepShape((), (10,))
    price = cost.step_time(decode)
    steps = [(decode, price), (decode, 1.5 * price), (decode, 10 * price), (decode, 4 * price)]
    count, extra = sim_fidelity.stalls(cost, steps)
    assert count == 2
    assert extra == pytest.approx(9 * price + 3 * price)


def test_bad_run_lengths_are_refused():
    import fidelity_load

    assert fidelity_load.lengths_of(None, 30) == [30]
    assert fidelity_load.lengths_of("30,120", 30) == [30, 120]
    with pytest.raises(SystemExit, match="comma-separated"):
        fidelity_load.lengths_of("30,x", 30)
    with pytest.raises(SystemExit, match=">= 1"):
        fidelity_load.lengths_of("0", 30)
    with pytest.raises(SystemExit, match=">= 8 requests"):
        fidelity_load.capacity(saved_run(), ProfiledCostModel(PRICES), "chat", {}, [4])


def test_canary_scaling_prices_steps_not_the_engines_time_and_simulates_slower():
    import sim_fidelity

    from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from heddle.metrics import summarize
    from heddle.sim.simulator import build_sim_engine, simulate
    from heddle.workloads import get_workload

    cost = ProfiledCostModel({**PRICES, "host_constant": 2e-4, "host_per_row": 1e-5})
    slow = sim_fidelity.scaled(cost, 1.25)
    decode = StepShape((), (10, 20))
    assert slow.executor_only().step_time(decode) == pytest.approx(
        1.25 * cost.executor_only().step_time(decode))
    assert slow.host_time(decode) == cost.host_time(decode)
    # Measured runs = this model's own simulation: priced at 1.0 nothing is off, at 1.25 the
    # run is slower (TPOT up, throughput down).
    config = EngineConfig(model=ModelConfig(dtype="float32"), cache=CacheConfig(block_size=16),
                          scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8))

    class Executor:
        model_shape = load_model_spec("smollm2-135m")
        num_blocks, max_model_len = 512, 4096

    workload = get_workload("chat", seed=0, num_requests=6, rate=2.0,
                            **sim_fidelity.WORKLOADS["chat"])  # fmt: skip
    sim = build_sim_engine(config, model=Executor.model_shape, cost_model=cost,
                           num_blocks=512, max_model_len=4096)  # fmt: skip
    summary = summarize(simulate(workload, sim).records)
    real = sim_fidelity.compare(summary, summary)
    runs = [{"rows": real}] * 3
    same = sim_fidelity.rescaled_errors(config, Executor(), cost, workload, runs, [1.0] * 3)
    assert all(abs(e) < 1e-9 for e in same.values())
    slower = sim_fidelity.rescaled_errors(config, Executor(), cost, workload, runs, [1.25] * 3)
    assert slower["tpot p50"] > 0.2 and slower["output tok/s"] < 0
    # Each run is priced at its own ratio, and the errors are the median over the runs.
    assert sim_fidelity.rescaled_errors(config, Executor(), cost, workload, runs,
                                        [1.25, 1.0, 1.0]) == same  # fmt: skip
    assert sim_fidelity.rescaled_errors(config, Executor(), cost, workload, runs,
                                        [1.0, 1.25, 1.25]) == slower  # fmt: skip
    with pytest.raises(ValueError, match="2 ratios for 3 runs"):
        sim_fidelity.rescaled_errors(config, Executor(), cost, workload, runs, [1.0, 1.0])
