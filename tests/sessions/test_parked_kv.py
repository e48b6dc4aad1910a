"""Parked KV of agent sessions in the scheduler and the KV manager (no model, milliseconds)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.clock import VirtualClock
from heddle.config import SchedulerConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.scheduler import Scheduler
from heddle.errors import InvalidRequestError
from heddle.request import FinishReason, Request, SamplingParams
from heddle.sessions.session import SessionInfo
from tests.factories import EOS, sample_all

BLOCK = 4


def _scheduler(num_blocks: int = 32, retention: str = "cost", **options: object) -> Scheduler:
    config = SchedulerConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        retention=retention,
        retention_options=dict(options),
        max_park_seconds=100.0,
    )
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK), VirtualClock())


def _turn(
    request_id: str,
    prompt: list[int],
    session: str | None = "s",
    max_tokens: int = 2,
    arrival: float = 0.0,
    close: bool = False,
) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        arrival_time=arrival,
        eos_token_id=EOS,
        session=SessionInfo(session, close=close) if session is not None else None,
    )


def _run(scheduler: Scheduler, max_steps: int = 100) -> list[list[tuple[str, int]]]:
    """Step until nothing is left; each step's (request id, tokens computed)."""
    steps = []
    for _ in range(max_steps):
        if not scheduler.requests:
            return steps
        out = scheduler.schedule()
        steps.append(list(zip(out.request_ids, out.num_new_tokens, strict=True)))
        scheduler.update(out, sample_all(out))
        _check(scheduler)
    raise AssertionError("did not finish")


def _check(scheduler: Scheduler) -> None:
    scheduler.kv_cache.check_integrity()
    scheduler.sessions.check_integrity()


def _used_not_parked(scheduler: Scheduler) -> int:
    kv = scheduler.kv_cache
    return kv.num_used_blocks - kv.num_parked_blocks


def test_a_finished_turn_parks_its_full_blocks_and_the_next_turn_computes_only_new_tokens():
    scheduler = _scheduler()
    first = _turn("t0", list(range(100, 118)))  # 18 tokens: 4 full blocks + 2
    scheduler.add_request(first)
    _run(scheduler)
    kv = scheduler.kv_cache
    # 18 prompt + 1 computed output = 19 computed: 4 full blocks registered and parked.
    assert kv.parked_block_ids("s") and len(kv.parked_block_ids("s")) == 4
    assert kv.num_used_blocks == 4 == kv.num_parked_blocks
    # Other requests, one after the other, churn through the whole free pool: LRU would have
    # evicted the session's blocks.
    for i in range(6):
        scheduler.add_request(_turn(f"o{i}", list(range(1000 + 40 * i, 1020 + 40 * i)), None))
        _run(scheduler)
    assert len(kv.parked_block_ids("s")) == 4
    context = [*first.all_token_ids, 500, 501, 502]  # the tool's result
    second = _turn("t1", context, arrival=1.0)
    scheduler.add_request(second)
    steps = _run(scheduler)
    # 23 tokens, 16 found parked: the first step computes 7, then one decode.
    assert steps[0] == [("t1", len(context) - 16)]
    assert second.num_cached_tokens == 16
    assert scheduler.sessions.stats.num_resumed_kept == 1


def test_parked_blocks_are_never_handed_to_another_request():
    scheduler = _scheduler(num_blocks=12)
    scheduler.add_request(_turn("t0", list(range(100, 117))))
    _run(scheduler)
    parked = set(scheduler.kv_cache.parked_block_ids("s"))
    assert len(parked) == 4
    # Eight free blocks are left; a request of 28 tokens fits in them and must not take any
    # parked block (no pressure: the cost policy keeps the session).
    other = _turn("o", list(range(2000, 2028)), None, max_tokens=3)
    scheduler.add_request(other)
    out = scheduler.schedule()
    assert not parked & set(scheduler.kv_cache.block_ids("o"))
    scheduler.update(out, sample_all(out))
    _run(scheduler)
    assert set(scheduler.kv_cache.parked_block_ids("s")) == parked


def test_lru_parks_nothing_and_churn_evicts_the_context():
    scheduler = _scheduler(num_blocks=12, retention="lru")
    first = _turn("t0", list(range(100, 117)))
    scheduler.add_request(first)
    _run(scheduler)
    assert scheduler.kv_cache.num_used_blocks == 0 and not scheduler.sessions.parked
    for i in range(3):
        scheduler.add_request(_turn(f"o{i}", list(range(3000 + 60 * i, 3044 + 60 * i)), None))
        _run(scheduler)
    second = _turn("t1", [*first.all_token_ids, 7, 7])
    scheduler.add_request(second)
    _run(scheduler)
    assert second.num_cached_tokens == 0  # recomputed from scratch


def test_pressure_releases_parked_sessions_instead_of_preempting():
    scheduler = _scheduler(num_blocks=10)
    for name, base in (("a", 100), ("b", 200)):
        turn = _turn(f"{name}0", list(range(base, base + 17)), session=name)
        scheduler.add_request(turn)
        _run(scheduler)
    assert scheduler.kv_cache.num_parked_blocks == 8
    # A request that needs 8 blocks: only parked memory can give them.
    big = _turn("big", list(range(5000, 5030)), None, max_tokens=2)
    scheduler.add_request(big)
    _run(scheduler)
    assert big.is_finished and big.finish_reason is FinishReason.LENGTH
    assert scheduler.num_preemptions == 0
    assert scheduler.sessions.stats.num_released_pressure >= 1
    assert _used_not_parked(scheduler) == 0


def test_ttl_expiry_frees_everything():
    scheduler = _scheduler(retention="ttl", ttl=2.0)
    scheduler.add_request(_turn("t0", list(range(100, 120))))
    _run(scheduler)
    assert scheduler.kv_cache.num_parked_blocks == 5
    clock = scheduler.clock
    assert isinstance(clock, VirtualClock)
    clock.advance(1.0)
    scheduler.schedule()
    assert scheduler.kv_cache.num_parked_blocks == 5
    clock.advance(1.5)
    scheduler.schedule()
    assert scheduler.kv_cache.num_used_blocks == 0 and not scheduler.sessions.parked
    _check(scheduler)


def test_a_vanished_client_leaks_nothing_after_max_park_seconds():
    scheduler = _scheduler()  # cost: keeps without pressure, but never past 100 s
    scheduler.add_request(_turn("t0", list(range(100, 120))))
    _run(scheduler)
    clock = scheduler.clock
    assert isinstance(clock, VirtualClock)
    clock.advance(99.0)
    scheduler.schedule()
    assert scheduler.sessions.parked
    clock.advance(1.0)
    scheduler.schedule()
    assert scheduler.kv_cache.num_used_blocks == 0
    _check(scheduler)


def test_close_and_abort_release_the_session():
    scheduler = _scheduler()
    scheduler.add_request(_turn("t0", list(range(100, 120))))
    _run(scheduler)
    last = _turn("t1", list(range(100, 124)), close=True)
    scheduler.add_request(last)
    _run(scheduler)
    assert last.num_cached_tokens == 20
    assert scheduler.kv_cache.num_used_blocks == 0 and not scheduler.sessions.parked
    scheduler.add_request(_turn("u0", list(range(300, 320)), session="u"))
    _run(scheduler)
    aborted = _turn("u1", list(range(300, 330)), session="u")
    scheduler.add_request(aborted)
    scheduler.schedule()
    scheduler.finish_request("u1", FinishReason.ABORT)
    assert scheduler.kv_cache.num_used_blocks == 0
    _check(scheduler)


def test_a_session_has_one_turn_in_flight():
    scheduler = _scheduler()
    scheduler.add_request(_turn("t0", list(range(100, 110))))
    with pytest.raises(InvalidRequestError, match="already has a turn in flight"):
        scheduler.add_request(_turn("t1", list(range(100, 112))))


def test_preempting_a_sessions_running_turn_keeps_integrity():
    scheduler = _scheduler(num_blocks=9)
    scheduler.add_request(_turn("a0", list(range(100, 117)), session="a"))
    _run(scheduler)
    # Two turns that each grow past what is left: one of them is preempted at least once.
    scheduler.add_request(_turn("a1", [*list(range(100, 118)), 1, 2], session="a", max_tokens=9))
    scheduler.add_request(_turn("b0", list(range(700, 712)), session="b", max_tokens=9))
    _run(scheduler, max_steps=300)
    assert scheduler.num_preemptions + scheduler.sessions.stats.num_released_pressure >= 1
    assert _used_not_parked(scheduler) == 0


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["turn", "pause", "abort", "close", "step"]),
            st.integers(0, 3),
            st.integers(1, 30),
        ),
        min_size=1,
        max_size=40,
    ),
    retention=st.sampled_from(["lru", "ttl", "cost"]),
)
def test_random_turns_pauses_expiries_and_aborts_keep_the_books(ops, retention):
    options = {"ttl": 3.0} if retention == "ttl" else {}
    scheduler = _scheduler(num_blocks=16, retention=retention, **options)
    clock = scheduler.clock
    assert isinstance(clock, VirtualClock)
    contexts: dict[str, list[int]] = {}
    in_flight: dict[str, str] = {}
    counter = 0
    for op, who, amount in ops:
        session = f"s{who}"
        if op == "pause":
            clock.advance(amount / 10)
        elif op in ("turn", "close") and session not in in_flight:
            context = contexts.get(session, [1000 * (who + 1)]) + [50 + amount] * amount
            context = context[-50:] if len(context) > 50 else context
            counter += 1
            request = _turn(
                f"{session}-{counter}", context, session, max_tokens=1 + amount % 4,
                arrival=clock.now(), close=op == "close",
            )
            scheduler.add_request(request)
            in_flight[session] = request.request_id
            contexts[session] = request.all_token_ids
        elif op == "abort" and session in in_flight:
            scheduler.finish_request(in_flight.pop(session), FinishReason.ABORT)
        if scheduler.requests:
            out = scheduler.schedule()
            scheduler.update(out, sample_all(out))
        for sid, rid in list(in_flight.items()):
            if rid not in scheduler.requests:
                del in_flight[sid]
        _check(scheduler)
    _run(scheduler, max_steps=500)
    assert _used_not_parked(scheduler) == 0
    scheduler.sessions.release_all()
    assert scheduler.kv_cache.num_used_blocks == 0
    _check(scheduler)
