"""SimulatedExecutor: time from the cost model, EOS at the true output length."""

from __future__ import annotations

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import OutputBuilder
from heddle.sim.cost_model import StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.registry import ConstantCostModel
from heddle.sim.roofline import RooflineCostModel
from heddle.sim.simulator import sim_engine, simulate
from heddle.workloads import Workload, WorkloadRequest
from tests.sim.factories import sampled, scheduled, step

EOS = 2


def test_clock_advances_by_the_cost_models_time():
    model = RooflineCostModel("llama-3.1-8b", "h100")
    clock = VirtualClock(start=10.0)
    executor = SimulatedExecutor(model, clock, vocab_size=1000)
    so = step(scheduled("a", 32, 0), scheduled("b", 1, 99, num_prompt_tokens=50))
    out = executor.execute(so)
    expected = model.step_time(StepShape.from_scheduler_output(so))
    assert out.step_duration == expected
    assert clock.now() == 10.0 + expected
    assert executor.execute(step()).step_duration == 0.0  # nothing ran
    assert clock.now() == 10.0 + expected


def test_one_token_per_sampling_request():
    executor = SimulatedExecutor(ConstantCostModel(0.1), VirtualClock(), vocab_size=1000)
    so = step(scheduled("a", 16, 0, sample=False, num_prompt_tokens=40), scheduled("b", 1, 7))
    out = executor.execute(so)
    assert set(sampled(so, out)) == {"b"}
    assert len(sampled(so, out)["b"]) == 1


def test_eos_exactly_at_the_true_output_length():
    executor = SimulatedExecutor(ConstantCostModel(), VirtualClock(), vocab_size=50, seed=3)
    tokens = []
    for num_output in range(5):
        so = step(
            scheduled(
                "r",
                1,
                9 + num_output,  # computes the last known token: prompt + num_output
                num_prompt_tokens=10,
                num_output_tokens=num_output,
                true_output_len=5,
                eos_token_id=EOS,
            )
        )
        tokens.extend(sampled(so, executor.execute(so))["r"])
    assert tokens[-1] == EOS
    assert EOS not in tokens[:-1]
    # The first token of a one-token answer is EOS too (sampled at the end of the prompt).
    first = step(scheduled("s", 10, 0, true_output_len=1, eos_token_id=EOS))
    assert sampled(first, executor.execute(first))["s"] == [EOS]


def test_tokens_are_deterministic_and_avoid_stop_tokens():
    """A request's ordinary token is one id, drawn once from (seed, request id): the same on
    every run, never EOS or a stop token; across requests it covers the other ids."""

    def tokens(seed: int, request_id: str, steps: int = 3) -> list[int]:
        executor = SimulatedExecutor(ConstantCostModel(), VirtualClock(), vocab_size=8, seed=seed)
        so = step(scheduled(request_id, 5, 0, eos_token_id=EOS, stop_token_ids=(3, 5)))
        out = [sampled(so, executor.execute(so))[request_id][0]]
        for i in range(1, steps):  # the same request decoding on (sent once, then a row)
            builder = OutputBuilder(i)
            builder.add(request_id, 4 + i, 1, True, num_prompt_tokens=5)
            so = builder.build()
            out.append(sampled(so, executor.execute(so))[request_id][0])
        return out

    assert tokens(0, "a") == tokens(0, "a")
    assert len(set(tokens(0, "a"))) == 1
    per_request = {tokens(seed, f"r{i}", 1)[0] for seed in (0, 1) for i in range(100)}
    assert per_request == {0, 1, 4, 6, 7}  # never EOS (2) or a stop token (3, 5)


def test_a_vocabulary_of_only_stop_tokens_is_an_error():
    executor = SimulatedExecutor(ConstantCostModel(), VirtualClock(), vocab_size=2)
    with pytest.raises(ValueError, match="every token"):
        executor.execute(step(scheduled("a", eos_token_id=0, stop_token_ids=(1,))))


def test_the_real_engine_finishes_each_request_at_its_true_length():
    model = RooflineCostModel("llama-3.1-8b", "h100")
    workload = Workload(
        name="hand",
        params={},
        seed=0,
        requests=[
            WorkloadRequest(f"r{i}", 0.001 * i, prompt_len=20 + 7 * i, output_len=1 + 3 * i)
            for i in range(6)
        ],
    )
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
    )
    engine = sim_engine(
        config,
        lambda clock: SimulatedExecutor(model, clock, vocab_size=1000),
        num_blocks=64,
        vocab_size=1000,
    )
    result = simulate(workload, engine)
    records = {r.request_id: r for r in result.records}
    assert len(records) == 6
    for i in range(6):
        assert records[f"r{i}"].num_output_tokens == 1 + 3 * i
    # Each step took the roofline's time for its shape: the clock is their sum.
    assert result.elapsed == pytest.approx(
        sum(s.duration for s in result.step_stats), rel=1e-9
    )
