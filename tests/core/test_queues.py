"""The waiting queues that stay in the policy's order (heddle/core/queues.py) and the steps'
column store (heddle/metrics/steps.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.queues import GroupedQueue, RankedQueue
from heddle.engine.engine import Engine
from heddle.metrics.steps import StepLog, StepStat
from heddle.request import SamplingParams
from heddle.sim import RooflineCostModel, SimulatedExecutor

# Options that make the keys move while requests wait: mlfq promotes after 50 ms unserved,
# slo's requests turn lost after 2-3 x 40 ms, sjf's predictor learns from every finish.
DYNAMIC = {
    "sjf": {"aging_seconds": 0.05, "default_output_len": 12},
    "mlfq": {"quantum": 4, "prompt_quantum": 64, "starvation_seconds": 0.05},
    "slo": {"default_ttft": 0.04, "default_tpot": 0.01, "ttft": {"long": 0.1}},
    "fair": {},
}


def _overloaded_engine(policy: str, options: dict[str, Any]) -> tuple[Engine, VirtualClock]:
    clock = VirtualClock()
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=256,
            max_num_seqs=6,
            policy=policy,
            policy_options=options,
            max_recompute_ratio=None,
        ),
    )
    executor = SimulatedExecutor(RooflineCostModel("llama-3.1-8b", "h100"), clock, vocab_size=32000)
    engine = Engine(config, executor, num_blocks=160, clock=clock, eos_token_id=2)
    return engine, clock


@pytest.mark.parametrize("policy", sorted(DYNAMIC))
def test_the_kept_order_is_the_sorted_order_at_every_step(policy: str) -> None:
    """Under overload with keys that move (promotions, lost deadlines, learning, counters),
    the order admission reads equals sorting every waiting request by its key at that step."""
    engine, clock = _overloaded_engine(policy, DYNAMIC[policy])
    scheduler = engine.scheduler
    waiting = scheduler.waiting
    assert isinstance(waiting, GroupedQueue if policy == "fair" else RankedQueue)
    rng = random.Random(7)
    arrivals = sorted(rng.uniform(0.0, 0.3) for _ in range(90))
    compared = moved = 0
    before: list[str] = []
    for step in range(2000):
        now = clock.now()
        while arrivals and arrivals[0] <= now:
            arrivals.pop(0)
            i = 90 - len(arrivals)
            prompt = [rng.randrange(100, 32000) for _ in range(rng.choice((8, 40, 90)))]
            params = SamplingParams(max_tokens=rng.choice((3, 10, 30)), ignore_eos=True)
            engine.add_request(
                f"r{i}", prompt, params, user=f"u{i % 4}", request_class=rng.choice(("a", "long"))
            )
        if isinstance(waiting, RankedQueue):
            waiting.refresh(now)  # what schedule() does first, at the same `now`
        policy_ = scheduler.policy
        kept = [r.request_id for r in policy_.waiting_candidates(waiting, now)]
        expected = [r.request_id for r in policy_.order_waiting(list(waiting), now)]
        assert kept == expected, f"step {step}"
        compared += len(kept)
        moved += kept != [r for r in before if r in set(kept)][: len(kept)]
        before = kept
        if not engine.has_unfinished_requests() and not arrivals:
            break
        if engine.has_unfinished_requests():
            engine.step()
            scheduler.check_integrity()
        else:
            clock.wait_until(arrivals[0])
    assert not engine.has_unfinished_requests()
    assert compared > 500  # the queue was long for many steps
    assert moved > 10  # and its order changed


def test_ranked_queue_rekeys_all_when_the_epoch_moves_and_only_then() -> None:
    class Keys:
        keys_epoch = 0

        def __init__(self) -> None:
            self.offset: dict[str, float] = {}
            self.calls = 0

        def sort_key(self, request: Any, now: float) -> tuple[float, ...]:
            self.calls += 1
            return (self.offset.get(request.request_id, 0.0) + request.seq, request.seq)

        def key_change_time(self, request: Any, now: float) -> float | None:
            return None

        def take_moved(self) -> list[str]:
            return []

    class R:
        def __init__(self, seq: int) -> None:
            self.request_id, self.seq = f"r{seq}", seq

    keys = Keys()
    queue = RankedQueue(keys, lambda: 0.0)
    requests = [R(i) for i in range(5)]
    for request in requests:
        queue.add(request)  # type: ignore[arg-type]
    assert [r.seq for r in queue.in_order(0.0)] == [0, 1, 2, 3, 4]
    calls = keys.calls
    queue.refresh(1.0)
    assert [r.seq for r in queue.in_order(1.0)] == [0, 1, 2, 3, 4] and keys.calls == calls
    keys.offset = {"r0": 10.0, "r3": -5.0}
    keys.keys_epoch += 1
    queue.add(R(5))  # type: ignore[arg-type]  # joins while stale: keyed with the others
    queue.remove(requests[1])  # type: ignore[arg-type]
    assert [r.seq for r in queue.in_order(2.0)] == [3, 2, 4, 5, 0]
    assert [r.seq for r in queue] == [0, 2, 3, 4, 5]  # iteration: in the order they joined
    queue.check_integrity()


def test_step_log_reads_back_what_was_recorded() -> None:
    log = StepLog()
    first = StepStat(0, 0.5, 0.01, 100, 0, 1, 2, 7, 64, token_budget=512)
    log.append(first)
    log.record(1, 0.51, 0.02, 0, 3, 3, 0, 8, 64, 512, 3, ["a", "b", "c"])
    assert len(log) == 2 and log
    assert log[0] == first and log[0].num_requests == 0
    assert log[-1].request_ids == ["a", "b", "c"] and log[1].num_tokens == 3
    assert [s.step_id for s in log] == [0, 1] and log[1:][0].duration == 0.02
    assert list(log.column("kv_blocks_used")) == [7, 8]
    with pytest.raises(IndexError):
        log[2]
    log.clear()
    assert len(log) == 0 and list(log) == []
