"""The multi-replica simulator: one replica is the single-engine simulator, failures lose no
token, affinity keeps sessions together."""

from __future__ import annotations

import pytest

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.errors import HeddleError
from heddle.router import Router
from heddle.router.replay import ReplicaFailure
from heddle.router.simulate import simulate_cluster
from heddle.sim import ConstantCostModel, RooflineCostModel, SimulatedExecutor
from heddle.sim.simulator import sim_engine, simulate
from heddle.workloads import get_workload

VOCAB = 32000
CONFIG = EngineConfig(
    cache=CacheConfig(block_size=16),
    scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64),
)


def roofline() -> RooflineCostModel:
    return RooflineCostModel("llama-3.1-8b", "h100", tp=1)


def cluster(workload, n, router="least-tokens", failures=(), num_blocks=4000, **options):
    return simulate_cluster(
        workload,
        CONFIG,
        roofline(),
        num_replicas=n,
        router=router,
        router_options=options,
        num_blocks=num_blocks,
        vocab_size=VOCAB,
        failures=failures,
    )


def timings(records):
    return sorted(
        (r.request_id, r.arrival_time, r.first_token_time, r.finish_time, len(r.token_times))
        for r in records
    )


@pytest.mark.parametrize("name", ["chat", "agent"])
def test_one_replica_is_the_single_engine_simulator(name: str) -> None:
    workload = get_workload(name, num_requests=60, rate=20.0, seed=1)
    cost = roofline()
    engine = sim_engine(
        CONFIG,
        lambda clock: SimulatedExecutor(cost, clock, vocab_size=VOCAB),
        num_blocks=4000,
        vocab_size=VOCAB,
    )
    single = simulate(workload, engine)
    multi = cluster(workload, 1)
    assert timings(multi.records) == timings(single.records)
    assert multi.num_steps == single.num_steps


def test_failure_resumes_every_request_without_losing_a_token() -> None:
    workload = get_workload("chat", num_requests=200, rate=40.0, seed=2)
    calm = cluster(workload, 2)
    failed = cluster(workload, 2, failures=[ReplicaFailure(1, 2.0, restart_after=1.0)])
    assert failed.num_resumed > 0
    assert failed.num_lost_tokens == 0 and not failed.rejected
    want = {r.request_id: len(r.token_times) for r in calm.records}
    got = {r.request_id: len(r.token_times) for r in failed.records}
    assert got == want == {r.request_id: r.output_len for r in workload.requests}
    for record in failed.records:  # token times stay monotone across the move
        assert record.token_times == sorted(record.token_times)
        assert record.first_token_time == record.token_times[0]
    assert failed.replicas[1].num_failures == 1
    # After the restart the router used replica 1 again.
    assert failed.replicas[1].num_routed > calm.replicas[1].num_routed // 4


def test_without_a_restart_the_survivors_take_everything() -> None:
    workload = get_workload("chat", num_requests=80, rate=40.0, seed=3)
    result = cluster(workload, 3, failures=[ReplicaFailure(0, 0.5, restart_after=None)])
    assert len(result.records) == 80 and result.num_lost_tokens == 0


def test_all_replicas_down_rejects_like_a_503() -> None:
    workload = get_workload("chat", num_requests=40, rate=10.0, seed=4)
    fails = [ReplicaFailure(0, 1.0, None), ReplicaFailure(1, 1.0, None)]
    result = cluster(workload, 2, failures=fails)
    assert result.rejected and all("503" in reason for _, reason in result.rejected)
    assert len(result.records) + len(result.rejected) == 40


def test_affinity_keeps_an_agents_calls_on_one_replica() -> None:
    workload = get_workload("agent", num_requests=30, rate=4.0, seed=5)
    result = cluster(workload, 4, router="affinity")
    rr = cluster(workload, 4, router="round-robin")
    assert result.prefix_hit_rate > rr.prefix_hit_rate + 0.2
    assert result.router == "affinity"


def test_parse_failure_specs() -> None:
    assert ReplicaFailure.parse("3@12.5") == ReplicaFailure(3, 12.5, 10.0)
    assert ReplicaFailure.parse("0@1+2") == ReplicaFailure(0, 1.0, 2.0)
    assert ReplicaFailure.parse("0@1+never") == ReplicaFailure(0, 1.0, None)
    with pytest.raises(HeddleError):
        ReplicaFailure.parse("x@1")


def test_constant_cost_scales_with_replicas() -> None:
    # A step costs the same however full: N replicas finish N times the work in the same time.
    workload = get_workload("random", num_requests=64, input_len=64, output_len=32, seed=6)
    times = []
    for n in (1, 4):
        result = simulate_cluster(
            workload,
            EngineConfig(scheduler=SchedulerConfig(max_num_seqs=4)),
            ConstantCostModel(0.01),
            num_replicas=n,
            router=Router("round-robin", n),
            num_blocks=1000,
            vocab_size=VOCAB,
        )
        times.append(result.elapsed)
    assert times[0] == pytest.approx(4 * times[1], rel=0.05)


def test_the_simulate_command_runs_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.cli import main

    base = ["simulate", "--workload", "agent", "--num-requests", "6", "--rate", "2",
            "--replicas", "3", "--no-progress"]  # fmt: skip
    assert main([*base, "--router", "affinity", "--fail", "1@2+1"]) == 0
    out = capsys.readouterr().out
    assert "3 replicas, router affinity" in out and "0 tokens lost" in out
    assert "replica  1:" in out and "1 failure(s)" in out
    assert main([*base, "--router", "nope"]) == 2
    assert "unknown router 'nope'" in capsys.readouterr().err
