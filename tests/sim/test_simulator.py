"""The simulator's event loop over the real engine, with a fixed-step-time executor."""

from __future__ import annotations

import pytest

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.sim.simulator import sim_engine, simulate
from heddle.workloads import Workload, WorkloadRequest, get_workload
from tests.factories import CountingExecutor

STEP = 0.01


def config(**scheduler: object) -> EngineConfig:
    return EngineConfig(cache=CacheConfig(block_size=4), scheduler=SchedulerConfig(**scheduler))  # type: ignore[arg-type]


def workload(requests: list[WorkloadRequest]) -> Workload:
    return Workload(name="hand", params={}, seed=0, requests=requests)


def run(wl: Workload, num_blocks: int = 256, **scheduler: object):
    engine = sim_engine(
        config(**scheduler),
        lambda clock: CountingExecutor(clock, step_time=STEP),
        num_blocks=num_blocks,
        vocab_size=1000,
        record_step_requests=True,
    )
    return simulate(wl, engine)


def test_idle_engine_jumps_to_next_arrival():
    wl = workload([WorkloadRequest("a", 5.0, prompt_len=4, output_len=2)])
    result = run(wl)
    (record,) = result.records
    assert record.first_scheduled_time == 5.0
    assert record.ttft == pytest.approx(STEP)
    assert record.e2e == pytest.approx(2 * STEP)
    assert result.elapsed == pytest.approx(5.0 + 2 * STEP)


def test_arrival_at_a_step_end_joins_the_next_step():
    # a's first step runs [0, 0.01); b arrives exactly at 0.01: it is admitted at that step end.
    wl = workload(
        [
            WorkloadRequest("a", 0.0, prompt_len=4, output_len=3),
            WorkloadRequest("b", STEP, prompt_len=4, output_len=1),
        ]
    )
    result = run(wl)
    records = {r.request_id: r for r in result.records}
    assert records["b"].first_scheduled_time == pytest.approx(STEP)
    assert records["b"].ttft == pytest.approx(STEP)
    assert [s.request_ids for s in result.step_stats[:2]] == [["a"], ["a", "b"]]


def test_equal_arrivals_keep_workload_order():
    wl = workload([WorkloadRequest(f"r{i}", 1.0, prompt_len=4, output_len=1) for i in (3, 1, 2)])
    result = run(wl, max_num_seqs=1)
    assert [r.request_id for r in result.records] == ["r3", "r1", "r2"]


def test_simulation_is_deterministic_under_a_seed():
    def once():
        wl = get_workload("chat", num_requests=40, rate=20.0, seed=7, length_scale=0.1)
        result = run(wl, max_num_batched_tokens=64, max_num_seqs=8)
        return [(r.request_id, r.first_token_time, r.finish_time) for r in result.records]

    first = once()
    assert len(first) == 40
    assert first == once()


def test_agent_calls_arrive_after_tool_latency_and_reuse_context():
    wl = get_workload("agent-swe", num_requests=3, rate=1.0, seed=1, length_scale=0.1)
    result = run(wl, num_blocks=4096, max_num_batched_tokens=256)
    assert result.rejected == []
    flat = wl.flat()
    assert len(result.records) == len(flat)
    engine = result.engine
    assert engine is not None
    assert engine.kv_cache.prefix_hits > 0  # later calls extend the earlier context
    records = {r.request_id: r for r in result.records}
    for request in flat:
        if request.call_index > 0:
            previous = records[request.request_id.rsplit(".", 1)[0] + f".{request.call_index - 1}"]
            assert records[request.request_id].arrival_time > previous.finish_time


def test_build_sim_engine_sizes_the_kv_pool_from_the_hardware_or_the_config():
    from heddle.sim.roofline import kv_cache_blocks
    from heddle.sim.simulator import build_sim_engine

    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256))
    engine = build_sim_engine(cfg, model="llama-3.1-8b", hardware="h100")
    expected = kv_cache_blocks("llama-3.1-8b", "h100", 16)
    assert engine.kv_cache.num_blocks == expected
    assert engine.vocab_size == 128256
    # fp32 weights and KV: twice the bytes per block, and less room left after the weights.
    fp32 = build_sim_engine(cfg, model="llama-3.1-8b", hardware="h100", dtype="float32")
    assert fp32.kv_cache.num_blocks < expected // 2
    pinned = EngineConfig(cache=CacheConfig(num_blocks=100))
    assert build_sim_engine(pinned).kv_cache.num_blocks == 100
    assert build_sim_engine(cfg, num_blocks=7).kv_cache.num_blocks == 7


def test_build_sim_engine_takes_any_cost_model_and_needs_a_pool_for_a_measured_one(tmp_path):
    from heddle.errors import HeddleError
    from heddle.sim.registry import ConstantCostModel
    from heddle.sim.simulator import build_sim_engine

    with pytest.raises(HeddleError, match="give num_blocks"):
        build_sim_engine(config(), cost_model=ConstantCostModel(STEP))
    with pytest.raises(HeddleError, match="no cost model file"):
        build_sim_engine(config(), cost_model=tmp_path / "missing.json", num_blocks=8)
    engine = build_sim_engine(
        config(), model="smollm2-135m", cost_model=ConstantCostModel(STEP), num_blocks=64
    )
    wl = workload([WorkloadRequest("a", 1.0, prompt_len=4, output_len=3)])
    (record,) = simulate(wl, engine).records
    assert record.e2e == pytest.approx(3 * STEP)
    assert engine.vocab_size == 49152  # the model's vocabulary
