"""The sessions' side of the scheduler: park a turn's KV when it ends, hand it to the next turn,
give it up when the retention policy says so.

The mechanism is small. When a turn of a session ends (not aborted, not the session's last), the
KV manager keeps one reference to each cached full block of its context (`KVCacheManager.park`):
those blocks leave the free pool, so LRU eviction cannot take them, and the prefix cache still
finds them. The next turn's prompt starts with that context, so admission finds the blocks as a
cached prefix and takes its own references; then the session's hold is dropped (`unpark`). A
parked session is released (its blocks go back to the free pool, still cached until reused):

- at once, when the retention policy says DROP as it parks (or the policy does not park: `lru`);
  OFFLOAD moves its blocks to the second tier instead (heddle/sessions/tier.py), from where
  the next turn copies back what the pool lost;
- when its pin runs out (`ttl`) or, whatever the policy, after `max_park_seconds` (a client
  that vanished leaks nothing);
- under pressure: when a running request needs blocks (otherwise one would be preempted), or a
  waiting one cannot start, the policy names sessions in its order (`reclaim_order`), not LRU;
- when its turn is aborted or the session is closed (`close_session` on its last turn).

With a draft model (speculation) the manager also tells the executor what happened to each
session (`DraftOrder`s, taken with every step): the draft model's KV of a paused session is
kept with it and given up under the draft pool's own pressure (heddle/sessions/draft_kv.py).

What the policy weighs comes from here: the expected remaining pause (heddle.sessions.pauses,
learned from the gaps between a session's turns, the hint as prior), the context's recompute
cost (the executor's cost model), the waiting requests' demand for blocks.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from heddle.core.block_hash import BlockHash
from heddle.core.kv_cache import KVCacheManager
from heddle.errors import InvalidRequestError
from heddle.request import FinishReason, Request
from heddle.sessions.draft_kv import DraftOrder, DraftOrderKind
from heddle.sessions.pauses import PauseEstimator
from heddle.sessions.retention import (
    Costs,
    LRURetention,
    ParkedView,
    Pressure,
    Retention,
    RetentionPolicy,
)
from heddle.sessions.tier import Offloaded, SecondTier

DEFAULT_MAX_PARK_SECONDS = 600.0  # no parked KV outlives this, whatever the policy
DEFAULT_RECOMPUTE_SECONDS_PER_TOKEN = 2e-4  # when the executor has no cost model
RECLAIM_RETRY_SECONDS = 0.1  # a futile reclaim is retried after this (pauses' estimates move)


@dataclass(slots=True)
class _Parked:
    session_id: str
    parked_at: float
    num_tokens: int  # tokens of context the held blocks cover
    tool: str | None
    hint: float | None
    resumed: bool = False  # its next turn has arrived (and waits for a seat)
    offloaded: Offloaded | None = None  # in the second tier (no pool blocks held)


@dataclass(slots=True)
class SessionStats:
    """Counters over a run (what the experiments report)."""

    num_parked: int = 0  # turns whose KV was parked
    num_resumed_kept: int = 0  # next turns that found their session's blocks still held
    num_released_pressure: int = 0  # sessions released under pressure
    num_released_expired: int = 0  # sessions released by their pin or the hard limit
    num_released_on_park: int = 0  # sessions the policy dropped as they parked
    blocks_released_pressure: int = 0
    num_offloaded_on_park: int = 0  # sessions the policy moved to the second tier as they parked
    num_offloaded_pressure: int = 0  # sessions moved to the second tier under pressure


class SessionManager:
    """Parked sessions of one engine (see the module docstring)."""

    def __init__(
        self,
        kv_cache: KVCacheManager,
        retention: RetentionPolicy | None = None,
        *,
        estimator: PauseEstimator | None = None,
        costs: Costs | None = None,
        max_park_seconds: float = DEFAULT_MAX_PARK_SECONDS,
    ) -> None:
        if not max_park_seconds > 0:
            raise ValueError("max_park_seconds must be positive")
        self.kv = kv_cache
        self.retention = retention or LRURetention()
        self.estimator = estimator or PauseEstimator()
        self.costs = costs or Costs(lambda n: n * DEFAULT_RECOMPUTE_SECONDS_PER_TOKEN)
        self.max_park_seconds = max_park_seconds
        self.parked: dict[str, _Parked] = {}
        self._last_end: dict[str, tuple[float, str | None]] = {}  # session -> (end, its tool)
        self._in_flight: set[str] = set()  # sessions with a turn queued or running
        # A reclaim that freed nothing is not retried for the same state until time moves on
        # (the admission loop asks every step while a request waits for memory).
        self._futile: tuple[object, ...] | None = None
        self._futile_until = 0.0
        self.stats = SessionStats()
        # The second tier (None: OFFLOAD is never possible); the engine sets it.
        self.tier: SecondTier | None = None
        self._deciding: _Parked | None = None  # parked by on_finished, decided in on_freed
        self._closing: set[str] = set()  # closed while a turn was in flight: it parks nothing
        # A draft model's KV (heddle/sessions/draft_kv.py): orders for the executor, and the
        # sessions whose draft KV may be parked (session -> when), expired like the target's.
        self.draft_orders: list[DraftOrder] = []
        self._tracks_draft = False
        self._draft_parked: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.retention.parks

    def track_draft(self) -> None:
        """The executor runs a draft model: keep it told about sessions (`take_draft_orders`)."""
        self._tracks_draft = True

    def take_draft_orders(self) -> list[DraftOrder]:
        """What happened to sessions since the last step that ran, in order (for the executor)."""
        orders, self.draft_orders = self.draft_orders, []
        return orders

    def _draft_order(self, kind: DraftOrderKind, session_id: str, request_id: str | None = None,
                     ) -> None:
        if not self._tracks_draft:
            return
        if kind is DraftOrderKind.END or kind is DraftOrderKind.RESUME:
            if self._draft_parked.pop(session_id, None) is None:
                return
        elif kind is DraftOrderKind.PARK:
            self._draft_parked.pop(session_id, None)  # re-inserted: parking order
            assert request_id is not None
        elif session_id not in self._draft_parked:
            return
        self.draft_orders.append(DraftOrder(kind, session_id, request_id))

    # -- scheduler hooks --------------------------------------------------------------------
    def on_arrival(self, request: Request) -> None:
        """A turn arrived: learn the pause that ended, mark the session's parked KV as wanted."""
        session = request.session
        if session is None:
            return
        sid = session.session_id
        if sid in self._in_flight:
            raise InvalidRequestError(
                f"session {sid!r} already has a turn in flight; send its next turn after it",
                "session_id",
            )
        self._in_flight.add(sid)
        last = self._last_end.pop(sid, None)
        if last is not None:
            self.estimator.observe(sid, last[1], max(0.0, request.arrival_time - last[0]))
        parked = self.parked.get(sid)
        if parked is not None:
            parked.resumed = True

    def on_admitted(self, request: Request) -> None:
        """The turn holds its blocks now (found as a cached prefix): drop the session's hold
        (a copy in the second tier that could not be restored is dropped: it recomputes)."""
        session = request.session
        if session is None:
            return
        self._draft_order(DraftOrderKind.RESUME, session.session_id, request.request_id)
        parked = self.parked.get(session.session_id)
        if parked is None:
            return
        if parked.offloaded is None:
            self.stats.num_resumed_kept += 1
        self._release(session.session_id)

    def restore_blocks_needed(self, request: Request) -> int:
        """Free pool blocks the turn's restore from the second tier needs (0: nothing to do)."""
        offloaded = self._offloaded_of(request)
        return 0 if offloaded is None else self.kv.free_blocks_to_restore(offloaded.chain)

    def restore(self, request: Request) -> bool:
        """Bring the turn's session back from the second tier into the pool (kept-parked
        again, so that admission finds its context as a cached prefix); the copies go out with
        this step. False when the free pool is short (nothing changed)."""
        offloaded = self._offloaded_of(request)
        if offloaded is None:
            return False
        assert self.tier is not None and request.session is not None
        sid = request.session.session_id
        copies = self.kv.restore_parked(sid, offloaded.chain)
        if copies is None:
            return False
        tier = self.tier
        tier.restore_orders.extend(copies)
        tier.release(offloaded.slots)
        tier.stats.num_restored += 1
        tier.stats.blocks_restored += len(copies)
        tier.stats.blocks_found_in_pool += len(self.kv.parked_block_ids(sid)) - len(copies)
        self.parked[sid].offloaded = None
        self._draft_order(DraftOrderKind.TARGET_POOL, sid)
        return True

    def _offloaded_of(self, request: Request) -> Offloaded | None:
        session = request.session
        if session is None:
            return None
        parked = self.parked.get(session.session_id)
        return None if parked is None else parked.offloaded

    def _offload(self, parked: _Parked) -> bool:
        """Move a kept session's blocks to the second tier: the ones it alone holds are copied
        out and freed in the pool. False (nothing changed) when the tier has no room."""
        tier = self.tier
        chain = self.kv.parked_chain(parked.session_id)
        own = sum(1 for _, _, alone in chain if alone)
        if tier is None or own == 0 or own > tier.num_free_slots:
            return False
        entries: list[tuple[BlockHash, int | None]] = []
        for block_hash, block_id, alone in chain:
            slot = tier.take_slot() if alone else None
            if slot is not None:
                tier.offload_orders.append((block_id, slot))
            entries.append((block_hash, slot))
        self.kv.unpark(parked.session_id)
        parked.offloaded = Offloaded(entries)
        self._draft_order(DraftOrderKind.TARGET_OUT, parked.session_id)
        tier.stats.num_offloaded += 1
        tier.stats.blocks_offloaded += own
        self._futile = None
        return True

    def on_finished(
        self, request: Request, reason: FinishReason, now: float, waiting: Iterable[Request]
    ) -> None:
        """The turn ended (called before its blocks are freed): park its context, or not."""
        session = request.session
        if session is None:
            return
        sid = session.session_id
        self._in_flight.discard(sid)
        closing = sid in self._closing
        self._closing.discard(sid)
        if reason is FinishReason.ABORT or session.close or closing:
            self._release(sid)
            self._draft_order(DraftOrderKind.END, sid)
            self._last_end.pop(sid, None)
            self.estimator.forget(sid)
            return
        self._last_end[sid] = (now, session.tool)
        if not self.enabled:
            return
        if self._tracks_draft:
            self._draft_order(DraftOrderKind.PARK, sid, request.request_id)
            self._draft_parked[sid] = now
        old = self.parked.get(sid)
        if old is not None and old.offloaded is not None:
            self._release(sid)  # a turn that ended without being admitted (never ran)
        num_blocks = self.kv.park(sid, request)
        if num_blocks == 0:
            self.parked.pop(sid, None)
            return
        parked = _Parked(sid, now, num_blocks * self.kv.block_size, session.tool,
                         session.expected_pause)
        self.parked[sid] = parked
        self.stats.num_parked += 1
        self._deciding = parked

    def on_freed(self, request: Request, waiting: Iterable[Request]) -> None:
        """The finished turn's own blocks are freed: the retention policy decides what
        happens to what its session parked (it sees the blocks the session alone holds)."""
        parked, self._deciding = self._deciding, None
        if parked is None or request.session is None:
            return
        if self.parked.get(request.session.session_id) is not parked:
            return
        pressure = pressure_of(waiting, self.kv, tier=self.tier)
        view = self._view(parked, parked.parked_at)
        choice = self.retention.on_park(view, pressure, self.costs)
        if choice is Retention.OFFLOAD and self._offload(parked):
            self.stats.num_offloaded_on_park += 1
        elif choice is not Retention.KEEP:
            self.stats.num_released_on_park += 1
            self._release(parked.session_id)

    def expire(self, now: float) -> None:
        """Release sessions whose pin ran out (the policy's, or the hard limit)."""
        if not self.parked:
            return
        pin = self.retention.pin_seconds
        limit = self.max_park_seconds if pin is None else min(pin, self.max_park_seconds)
        expired = []
        for parked in self.parked.values():  # in parking order: the oldest first
            if now - parked.parked_at < limit:
                break
            if not parked.resumed:
                expired.append(parked.session_id)
        for session_id in expired:
            self.stats.num_released_expired += 1
            self._release(session_id)
        if self._draft_parked:  # a draft model's KV lives no longer than the hard limit
            ended = []
            for sid, parked_at in self._draft_parked.items():  # in parking order
                if now - parked_at < self.max_park_seconds:
                    break
                if sid not in self._in_flight:
                    ended.append(sid)
            for sid in ended:
                self._draft_order(DraftOrderKind.END, sid)

    def reclaim(
        self,
        num_blocks: int,
        waiting: Iterable[Request],
        now: float,
        *,
        must: bool,
        exclude: str | None = None,
    ) -> bool:
        """Free parked blocks until `num_blocks` are free, in the policy's order. `must`: the
        alternative is preempting a running request (or nothing can run). `exclude`: the session
        of the request that wants the blocks. True if it freed any."""
        if not self.parked or self.kv.num_free_blocks >= num_blocks:
            return False
        state = (self.kv.num_free_blocks, len(self.parked), num_blocks, must, exclude)
        if state == self._futile and now < self._futile_until:
            return False
        views = [
            self._view(p, now)
            for p in self.parked.values()
            if p.session_id != exclude and p.offloaded is None
        ]
        if not views:
            return False
        extra = max(0, num_blocks - self.kv.num_free_blocks)
        pressure = pressure_of(waiting, self.kv, extra, tier=self.tier)
        freed = False
        for view, choice in self.retention.reclaim_order(views, pressure, self.costs, must=must):
            if self.kv.num_free_blocks >= num_blocks:
                break
            before = self.kv.num_free_blocks
            if choice is Retention.OFFLOAD and self._offload(self.parked[view.session_id]):
                self.stats.num_offloaded_pressure += 1
            else:
                self._release(view.session_id)
                self.stats.num_released_pressure += 1
            self.stats.blocks_released_pressure += self.kv.num_free_blocks - before
            freed = True
        if must and self.kv.num_free_blocks < num_blocks:
            # Mechanism, not policy: when the alternative is that nothing runs (or a running
            # request is preempted), parked KV gives way whatever the retention policy says,
            # oldest first, so a policy that keeps everything cannot stall the engine.
            for view in sorted(views, key=lambda v: (v.parked_at, v.session_id)):
                if self.kv.num_free_blocks >= num_blocks:
                    break
                if view.session_id not in self.parked:
                    continue
                before = self.kv.num_free_blocks
                self._release(view.session_id)
                self.stats.num_released_pressure += 1
                self.stats.blocks_released_pressure += self.kv.num_free_blocks - before
                freed = True
        if not freed:
            self._futile, self._futile_until = state, now + RECLAIM_RETRY_SECONDS
        return freed

    def close(self, session_id: str) -> bool:
        """Close a session (the API's close endpoint): its parked KV is released now, a turn in
        flight parks nothing when it ends, and what was learned of its pauses is forgotten.
        False when the engine holds nothing of it (no parked KV, no turn in flight)."""
        known = (session_id in self.parked or session_id in self._in_flight
                 or session_id in self._draft_parked)
        self._release(session_id)
        self._draft_order(DraftOrderKind.END, session_id)
        self._last_end.pop(session_id, None)
        self.estimator.forget(session_id)
        if session_id in self._in_flight:
            self._closing.add(session_id)
        return known

    def release_all(self) -> None:
        """Release every parked session (the engine shuts down, or a run ends)."""
        for sid in list(self.parked):
            self._release(sid)
        for sid in list(self._draft_parked):
            self._draft_order(DraftOrderKind.END, sid)
        self._last_end.clear()

    # -- queries ----------------------------------------------------------------------------
    def has_parked(self, request: Request) -> bool:
        """Whether the request's session has KV parked in the pool (its turn holds its memory
        already; not when it is in the second tier)."""
        session = request.session
        if session is None:
            return False
        parked = self.parked.get(session.session_id)
        return parked is not None and parked.offloaded is None

    @property
    def num_parked_blocks(self) -> int:
        return self.kv.num_parked_blocks

    def parked_views(self, now: float) -> list[ParkedView]:
        return [self._view(p, now) for p in self.parked.values()]

    def check_integrity(self) -> None:
        kept = {sid for sid, p in self.parked.items() if p.offloaded is None}
        if kept != set(self.kv.parked_sessions):
            raise AssertionError(
                f"sessions parked {sorted(kept)} but the KV manager holds blocks for "
                f"{sorted(self.kv.parked_sessions)}"
            )
        offloaded = [p.offloaded for p in self.parked.values() if p.offloaded is not None]
        if self.tier is not None:
            self.tier.check_integrity([o.slots for o in offloaded])
        elif offloaded:
            raise AssertionError("sessions offloaded without a second tier")

    # -- internals --------------------------------------------------------------------------
    def _view(self, parked: _Parked, now: float) -> ParkedView:
        if parked.resumed:
            remaining = 0.0
        else:
            estimate = self.estimator.estimate(parked.session_id, parked.tool, parked.hint)
            remaining = estimate.remaining(now - parked.parked_at)
        return ParkedView(
            session_id=parked.session_id,
            num_blocks=self.kv.num_freeable_parked_blocks(parked.session_id),
            num_tokens=parked.num_tokens,
            parked_at=parked.parked_at,
            expected_remaining=remaining,
            offloaded=parked.offloaded is not None,
        )

    def _release(self, session_id: str) -> None:
        parked = self.parked.pop(session_id, None)
        if parked is not None and parked.offloaded is not None:
            assert self.tier is not None
            self.tier.release(parked.offloaded.slots)
        else:
            self.kv.unpark(session_id)
        if parked is not None and parked.offloaded is None:
            self._draft_order(DraftOrderKind.TARGET_OUT, session_id)
        self._futile = None


def pressure_of(
    waiting: Iterable[Request],
    kv: KVCacheManager,
    extra_blocks: int = 0,
    limit: int = 64,
    *,
    tier: SecondTier | None = None,
) -> Pressure:
    """The demand for blocks: the first `limit` waiting requests' prompts, plus `extra_blocks`
    a running request needs now; the room left in the second tier."""
    wanted = extra_blocks
    num_waiting = 0
    for request in itertools.islice(waiting, limit):
        wanted += kv.blocks_needed(request.num_tokens + 1)
        num_waiting += 1
    return Pressure(
        num_free_blocks=kv.num_free_blocks,
        num_blocks_wanted=wanted,
        num_waiting=max(num_waiting, 1 if extra_blocks else 0),
        num_running_blocks=kv.num_used_blocks - kv.num_parked_blocks,
        num_host_free_blocks=tier.num_free_slots if tier is not None else 0,
    )


def recompute_cost_of(executor: object) -> Callable[[int], float] | None:
    """Seconds to recompute n tokens of context, from the executor's cost model (simulator)."""
    cost_model = getattr(executor, "cost_model", None)
    if cost_model is None:
        return None
    from heddle.sim.cost_model import StepShape

    @functools.lru_cache(maxsize=4096)
    def seconds(num_tokens: int) -> float:
        if num_tokens < 2:
            return 0.0
        return float(cost_model.step_time(StepShape(((num_tokens, num_tokens),), (), 1)))

    return seconds


def copy_cost_of(executor: object) -> Callable[[int], float] | None:
    """Seconds to copy n blocks to the second tier and back, from the executor (its
    `tier_copy_seconds`: measured on the real engine, the hardware spec's host bandwidth in
    the simulator); None when it has no second tier."""
    seconds = getattr(executor, "tier_copy_seconds", None)
    if seconds is None or not getattr(executor, "has_tier", False):
        return None

    def both_ways(num_blocks: int) -> float:
        return 2.0 * float(seconds(num_blocks))

    return both_ways
