"""Every stall is explained: the scheduler's decision events split each request's recorded stall
time by reason, exactly. Scenarios that reach every reason the scheduler can give."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.events import Eviction, Preemption, Recompute, StallInterval
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from heddle.sim.simulator import sim_engine, simulate
from heddle.workloads import Workload, WorkloadRequest
from tests.factories import CountingExecutor

STEP = 0.01


def workload(num: int, *, long_every: int = 3, spacing: float = 0.003) -> Workload:
    requests = [
        WorkloadRequest(
            f"r{i}",
            arrival_time=spacing * i,
            prompt_len=90 if i % long_every == 0 else 20,
            output_len=30 if i % long_every == 0 else 12,
            request_class="long" if i % long_every == 0 else "short",
            prompt_seed=i % 4,  # repeated prompts: prefix-cache hits, and evictions of them
        )
        for i in range(num)
    ]
    return Workload(name="stalls", params={}, seed=0, requests=requests)


def run(num_blocks: int, **scheduler: object):
    config = EngineConfig(
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(**{"decision_events": 1 << 20, **scheduler}),  # type: ignore[arg-type]
    )
    engine = sim_engine(
        config,
        lambda clock: CountingExecutor(clock, step_time=STEP),
        num_blocks=num_blocks,
        vocab_size=1000,
    )
    return simulate(workload(60), engine)


def explained(events) -> tuple[dict[str, float], Counter[str]]:  # type: ignore[no-untyped-def]
    by_request: dict[str, float] = defaultdict(float)
    reasons: Counter[str] = Counter()
    for event in events:
        if isinstance(event, StallInterval):
            by_request[event.request_id] += event.total
            for reason, seconds in event.seconds.items():
                assert seconds > 0
                reasons[reason] += 1
    return by_request, reasons


def assert_every_stall_explained(result) -> Counter[str]:  # type: ignore[no-untyped-def]
    events = result.engine.scheduler.events
    assert events.num_events == len(events)  # nothing fell off the ring
    by_request, reasons = explained(events)
    stalled = [r for r in result.records if r.stall_time > 0]
    assert stalled, "the scenario must make requests wait"
    for record in result.records:
        assert by_request.get(record.request_id, 0.0) == pytest.approx(
            record.stall_time, abs=1e-9
        ), record.request_id
    return reasons


@pytest.mark.parametrize(
    ("policy", "num_blocks", "options", "expected"),
    [
        # A small pool: requests preempt each other and wait for blocks; few seats.
        ("fcfs", 60, {"max_num_seqs": 4, "max_num_batched_tokens": 64},
         {"out_of_blocks", "preempted", "no_seat", "token_budget", "step_preempted"}),
        # Lanes: the long lane's share of each step is capped.
        ("lanes", 400, {"max_num_seqs": 8, "max_num_batched_tokens": 64,
                        "policy_options": {"long_prompt_tokens": 64, "long_share": 0.25}},
         {"lane_cap", "no_seat"}),
        # Request-level batching: admission is held until the whole batch has finished.
        ("static", 400, {"max_num_seqs": 6, "max_num_batched_tokens": 256},
         {"admission_held"}),
    ],
)  # fmt: skip
def test_stall_intervals_sum_to_the_recorded_stall_time(
    policy: str, num_blocks: int, options: dict[str, object], expected: set[str]
) -> None:
    result = run(num_blocks, policy=policy, **options)
    reasons = assert_every_stall_explained(result)
    assert expected <= set(reasons), reasons


def test_preemptions_name_victim_and_beneficiary_and_evictions_their_cause() -> None:
    result = run(60, max_num_seqs=4, max_num_batched_tokens=64)
    events = list(result.engine.scheduler.events)
    preemptions = [e for e in events if isinstance(e, Preemption)]
    assert len(preemptions) == result.num_preemptions > 0
    records = {r.request_id: r for r in result.records}
    for p in preemptions:
        assert p.victim_id in records and p.victim_class == records[p.victim_id].request_class
        assert p.beneficiary_id is None or p.beneficiary_id in records
    assert Counter(p.victim_id for p in preemptions) == Counter(
        {r.request_id: r.num_preemptions for r in result.records if r.num_preemptions}
    )
    evictions = [e for e in events if isinstance(e, Eviction)]
    assert evictions and all(
        e.num_blocks > 0 and set(e.for_request_ids) <= set(records) for e in evictions
    )
    assert sum(e.num_blocks for e in evictions) == result.engine.kv_cache.pool.num_evictions


def test_preempted_requests_recompute_and_name_the_evictions_that_made_them() -> None:
    result = run(60, max_num_seqs=4, max_num_batched_tokens=64)
    events = list(result.engine.scheduler.events)
    preemptions = {(e.victim_id, e.step_id) for e in events if isinstance(e, Preemption)}
    evictions = {e.step_id: e for e in events if isinstance(e, Eviction)}
    recomputes = [e for e in events if isinstance(e, Recompute)]
    assert recomputes
    for r in recomputes:
        assert (r.request_id, r.preempted_step) in preemptions
        assert r.preempted_step < r.start_step
        assert r.end_step is None or r.start_step <= r.end_step
        assert 0 <= r.num_cached <= r.num_tokens
        assert r.num_evicted_blocks <= r.num_cached_blocks
        for step in r.evicted_at_steps:  # each named eviction happened while it waited
            assert r.preempted_step <= step <= r.start_step
            assert set(evictions[step].for_request_ids) & set(r.evicted_for)
    # The small pool evicts what the victims left in the prefix cache: some must recompute it.
    assert any(r.num_evicted_blocks and r.num_recomputed for r in recomputes)


def test_children_wait_for_their_parent_and_say_so() -> None:
    clock = VirtualClock()
    config = EngineConfig(
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=8),
    )
    engine = Engine(
        config, CountingExecutor(clock, step_time=STEP), num_blocks=64, clock=clock,
        eos_token_id=2, vocab_size=1000,
    )  # fmt: skip
    params = SamplingParams(n=3, max_tokens=4, ignore_eos=True, temperature=0.0)
    engine.add_request("group", list(range(10, 30)), params)  # a 20-token prompt: 3 chunks
    while engine.has_unfinished_requests():
        engine.step()
    by_request, reasons = explained(engine.scheduler.events)
    assert reasons["parent_not_ready"] >= 2  # each child, while the parent's prompt computes
    for record in engine.finished_records:
        assert by_request.get(record.request_id, 0.0) == pytest.approx(record.stall_time)


def test_decision_events_can_be_turned_off() -> None:
    result = run(60, max_num_seqs=4, max_num_batched_tokens=64, decision_events=0)
    assert result.engine.scheduler.events is None
    assert result.engine.kv_cache.events is None
    assert any(r.stall_time > 0 for r in result.records)
