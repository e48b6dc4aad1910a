"""The decision log on its own: stall attribution by reason, preemptions, evictions, the ring."""

from __future__ import annotations

import pytest

from heddle.core.events import (
    DecisionLog,
    Eviction,
    Preemption,
    Queue,
    QueueStop,
    Recompute,
    StallInterval,
    StallReason,
)
from heddle.request import RequestStatus
from tests.factories import create_request


def intervals(log: DecisionLog) -> list[StallInterval]:
    return [e for e in log if isinstance(e, StallInterval)]


def test_waiting_behind_a_stop_is_charged_that_stops_reason() -> None:
    log = DecisionLog()
    a, b = create_request("a"), create_request("b")
    log.opened(a, StallReason.QUEUED)
    log.opened(b, StallReason.QUEUED)
    # Step 0: the admission loop runs out of blocks before reaching either of them.
    log.begin_step(0, 0.0)
    log.stop_queue(Queue.WAITING, StallReason.OUT_OF_BLOCKS)
    log.end_step(0.5)
    # Step 1: a second stop in the same loop keeps the first reason; both wait for seats.
    log.begin_step(1, 0.5)
    log.stop_queue(Queue.WAITING, StallReason.NO_SEAT)
    log.stop_queue(Queue.WAITING, StallReason.TOKEN_BUDGET)
    log.end_step(0.25)
    # Step 2: a is admitted; b is held by the policy.
    log.begin_step(2, 0.75)
    log.closed(a)
    log.skip(b, StallReason.ADMISSION_HELD)
    log.end_step(0.125)
    log.begin_step(3, 0.875)
    log.closed(b)
    log.end_step(0.1)

    (ia, ib) = intervals(log)
    assert ia.request_id == "a" and ia.queue == "waiting"
    assert ia.seconds == {"out_of_blocks": 0.5, "no_seat": 0.25}
    assert (ia.start_step, ia.end_step, ia.start_time, ia.end_time) == (0, 2, 0.0, 0.75)
    assert ib.seconds == {"out_of_blocks": 0.5, "no_seat": 0.25, "admission_held": 0.125}
    assert ib.total == pytest.approx(0.875)
    assert ib.main_reason == "out_of_blocks"
    stops = [(e.step_id, e.queue, e.reason) for e in log if isinstance(e, QueueStop)]
    assert stops == [
        (0, "waiting", "out_of_blocks"),
        (1, "waiting", "no_seat"),
        (2, "waiting", None),
    ]


def test_skipped_request_is_not_charged_the_stop_of_its_step() -> None:
    log = DecisionLog()
    a = create_request("a")
    log.opened(a, StallReason.QUEUED)
    log.begin_step(0, 0.0)
    log.skip(a, StallReason.PARENT_NOT_READY)
    log.stop_queue(Queue.WAITING, StallReason.TOKEN_BUDGET)  # a later request hit the budget
    log.end_step(1.0)
    log.begin_step(1, 1.0)
    log.closed(a)  # it finished
    (interval,) = intervals(log)
    assert interval.seconds == {"parent_not_ready": 1.0}


def test_running_request_left_out_then_served() -> None:
    log = DecisionLog()
    a, b = create_request("a"), create_request("b")
    a.status = b.status = RequestStatus.RUNNING
    log.begin_step(0, 0.0)
    log.opened(b, StallReason.TOKEN_BUDGET)  # the running loop did not reach it
    log.stop_queue(Queue.RUNNING, StallReason.TOKEN_BUDGET)
    log.end_step(0.5)
    assert log.is_stalled("b") and not log.is_stalled("a")
    log.begin_step(1, 0.5)
    log.opened(a, StallReason.LANE_CAP)
    log.skip(a, StallReason.LANE_CAP)
    log.closed(b)
    log.end_step(0.25)
    log.begin_step(2, 0.75)
    log.closed(a)
    (ib, ia) = intervals(log)
    assert (ib.request_id, ib.queue, ib.seconds) == ("b", "running", {"token_budget": 0.5})
    assert (ia.request_id, ia.seconds) == ("a", {"lane_cap": 0.25})


def test_preemption_records_victim_and_beneficiary_and_charges_the_victim() -> None:
    log = DecisionLog()
    victim, needy = create_request("v", request_class="batch"), create_request("n")
    victim.status = RequestStatus.RUNNING
    log.begin_step(4, 2.0)
    log.preempted(victim, needy, StallReason.OUT_OF_BLOCKS)
    log.opened(victim, StallReason.PREEMPTED)  # the accounting: it is idle from now
    log.stop_queue(Queue.WAITING, StallReason.STEP_PREEMPTED)
    log.end_step(0.5)
    log.begin_step(5, 2.5)
    log.stop_queue(Queue.WAITING, StallReason.NO_SEAT)
    log.end_step(0.25)
    log.begin_step(6, 2.75)
    log.closed(victim)
    (preemption,) = [e for e in log if isinstance(e, Preemption)]
    assert preemption == Preemption(4, 2.0, "v", "batch", "n", "out_of_blocks")
    (interval,) = intervals(log)
    assert interval.request_class == "batch"
    assert interval.seconds == {"preempted": 0.5, "no_seat": 0.25}
    assert log.num_preemptions == 1


def test_evictions_and_the_ring_buffer_bound() -> None:
    log = DecisionLog(capacity=3)
    for i in range(5):
        log.begin_step(i, float(i))
        log.evicted(f"r{i}", list(range(i + 1)))
        log.evicted(f"r{i}", [100])
        log.evicted("x", [101])
        log.end_step(0.1)
    assert len(log) == 3 and log.num_events == 5  # one event per step
    evictions = [e for e in log if isinstance(e, Eviction)]
    assert [e.for_request_ids for e in evictions] == [("r2", "x"), ("r3", "x"), ("r4", "x")]
    assert [e.num_blocks for e in evictions] == [5, 6, 7]
    assert log.num_evicted_blocks == 15 + 10
    # A reader that saw 3 events gets the two after them; one that saw none gets what is left.
    assert [e.num_blocks for e in log.events_since(3)] == [6, 7]  # type: ignore[union-attr]
    assert len(log.events_since(0)) == 3
    assert log.events_since(5) == []
    with pytest.raises(ValueError):
        DecisionLog(capacity=0)


def test_evictions_keep_their_place_among_the_other_events_as_both_rings_turn() -> None:
    """Evictions and the other events are kept apart (a flat array, a ring of tuples); what a
    reader gets is still the one order they happened in, however the two interleave and
    whichever drops its older half first."""
    import random

    rng = random.Random(7)
    log = DecisionLog(capacity=5, detail_capacity=4)
    expected: list[tuple[str, int]] = []  # (kind, step) in the order they happen
    reasons = [StallReason.NO_SEAT, StallReason.TOKEN_BUDGET]
    last_stop: StallReason | None = None
    seen = 0
    for step in range(200):
        log.begin_step(step, float(step))
        evicts = rng.random() < 0.6
        if evicts:
            log.evicted(f"r{step}", [step])
        stop = rng.choice([None, *reasons])
        if stop is not None:
            log.stop_queue(Queue.WAITING, stop)
        log.end_step(1.0)
        if evicts:  # the step's evictions are logged first, then the stops that changed
            expected.append(("evict", step))
        if stop != last_stop:
            expected.append(("stop", step))
            last_stop = stop
        assert log.num_events == len(expected)
        got = [("evict" if isinstance(e, Eviction) else "stop", e.step_id) for e in log]
        assert got == expected[-5:]
        if rng.random() < 0.3:  # a reader that comes back now and then gets what it missed
            new = log.events_since(seen)
            assert [e.step_id for e in new] == [s for _, s in expected[seen:]][-5:]
            seen = log.num_events
    evictions = [e for e in log if isinstance(e, Eviction)]
    assert evictions and all(e.num_blocks == 1 for e in evictions)
    last = evictions[-1]  # the newest keeps its detail
    assert last.block_ids == (last.step_id,) and last.for_request_ids == (f"r{last.step_id}",)


def test_eviction_detail_is_a_bounded_ring_of_its_own() -> None:
    log = DecisionLog(capacity=100, detail_capacity=4)
    for i in range(6):  # 3 blocks a step: the detail keeps 4..8 blocks
        log.begin_step(i, float(i))
        log.evicted(f"r{i}", [10 * i, 10 * i + 1])
        log.evicted("x", [10 * i + 2])
        log.end_step(0.1)
    assert log.num_evicted_blocks == 18 and len(log.evicted_blocks) <= 8
    evictions = [e for e in log if isinstance(e, Eviction)]
    assert [e.num_blocks for e in evictions] == [3] * 6  # every step keeps its count
    kept = [e for e in evictions if e.block_ids]
    assert kept and len(kept) < 6  # the oldest lost their ids, the newest have them exactly
    assert kept[-1] == Eviction(5, 5.0, 3, ("r5", "x"), "cached", (50, 51, 52))
    assert all(e.for_request_ids == () for e in evictions[: 6 - len(kept)])
    with pytest.raises(ValueError):
        DecisionLog(detail_capacity=0)


def test_the_kv_pool_writes_evictions_into_the_log() -> None:
    from heddle.core.kv_cache import KVCacheManager

    kv = KVCacheManager(num_blocks=4, block_size=4)
    log = DecisionLog()
    kv.events = log
    a, b = create_request("a", prompt_len=16), create_request("b", 16, first_token=500)
    log.begin_step(0, 0.0)
    assert kv.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    kv.commit_computed(a)
    kv.free(a)  # its 4 blocks stay cached in the free pool
    log.end_step(0.1)
    log.begin_step(1, 0.1)
    assert kv.allocate_slots(b, 8)  # takes 2 of them: evicted for b
    log.end_step(0.1)
    (eviction,) = [e for e in log if isinstance(e, Eviction)]
    assert eviction.step_id == 1 and eviction.for_request_ids == ("b",)
    assert eviction.num_blocks == 2 == kv.pool.num_evictions == log.num_evicted_blocks
    kv.events = None  # detached: the pool logs nothing more
    assert kv.pool.eviction_log is None


def test_a_preempted_request_recomputes_what_evictions_took_from_the_cache() -> None:
    log = DecisionLog()
    log.cached_blocks_of = lambda request: [3, 4, 5] if request.request_id == "v" else []
    victim, other = create_request("v", request_class="batch"), create_request("o")
    victim.num_computed_tokens = 40  # what it had computed when preempted
    log.begin_step(0, 0.0)
    log.preempted(victim, other, StallReason.OUT_OF_BLOCKS)
    log.end_step(0.5)
    victim.num_computed_tokens = 0
    log.begin_step(1, 0.5)
    log.evicted("o", [5, 9])  # one of its cached blocks goes to "o"
    log.end_step(0.5)
    log.begin_step(2, 1.0)
    log.evicted("x", [4])  # in the step it comes back: counted too
    victim.num_computed_tokens = 16  # blocks 3 (and the first) found in the cache
    log.scheduled(victim)
    log.end_step(0.25)
    victim.num_computed_tokens = 32  # still short of 40
    log.begin_step(3, 1.25)
    log.end_step(0.25)
    assert not [e for e in log if isinstance(e, Recompute)]
    victim.num_computed_tokens = 41  # caught up in step 3, which ended at 1.5
    log.begin_step(4, 1.5)
    (recompute,) = [e for e in log if isinstance(e, Recompute)]
    assert recompute == Recompute("v", "batch", 0, 2, 1.0, 3, 1.5, 40, 16, 3, 2, (1, 2), ("o", "x"))
    assert recompute.num_recomputed == 24
    # Preempted again, back, and finished before it caught up: its recompute ends unfinished.
    victim.num_computed_tokens = 8
    log.preempted(victim, None, StallReason.OUT_OF_BLOCKS)
    log.end_step(0.1)
    victim.num_computed_tokens = 0
    log.begin_step(5, 1.6)
    log.scheduled(victim)
    log.end_step(0.1)
    log.begin_step(6, 1.7)
    log.finished(victim)
    (_, second) = [e for e in log if isinstance(e, Recompute)]
    assert second == Recompute("v", "batch", 4, 5, 1.6, None, None, 8, 0, 3, 0, (), ())
