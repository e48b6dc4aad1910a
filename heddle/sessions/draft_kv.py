"""The draft model's KV of a paused session: kept while the session is paused, or dropped and
recomputed on its next turn.

With draft-model speculation (heddle/spec/draft.py) every request also has K/V in the draft
model's own pool, and without sessions it goes when the turn ends: the next turn's first
proposal then runs the draft model over the whole context again. The session manager
(heddle/sessions/manager.py) tells the executor, with each step, what happened to the sessions
since the last one (`DraftOrder`s: a turn parked, its target KV left the pool or came back, the
next turn was admitted, the session ended); `DraftSessions`, on the executor's side, applies
them to the proposer.

The decision. The draft's KV costs draft-pool memory while the session is paused, and dropping
it costs a draft prefill of the context on the next turn. The draft pool is the draft model's
own (as many blocks as the target's pool, each a fraction of a target block's bytes), so
holding a paused session's draft KV takes nothing from the target and nothing from any request
until the draft pool runs short; then it is what a running request's proposal cannot reserve.
So: KEEP at park, always (memory nobody wants is free), and DROP under the draft pool's own
pressure only, when a proposal round needs more blocks than are free, in this order:

1. sessions whose target KV is no longer in the pool (dropped: its next turn recomputes the
   context on the target anyway, and the draft's share of that recompute is small; or in the
   second tier: it comes back later than a kept one);
2. then sessions whose target KV is kept, so that a kept session resumes with nothing to
   recompute on either model;

oldest parked first within each. A session's draft KV ends with the session (close, abort, a
turn that ends it) and at `max_park_seconds`, like the target's: nothing outlives a vanished
client. With the `lru` retention (no session parks) nothing is kept, as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class DraftOrderKind(Enum):
    PARK = "park"  # the turn `request_id` ended: its draft KV stays for `session_id`
    TARGET_POOL = "target_pool"  # the session's target KV is kept in the pool (again)
    TARGET_OUT = "target_out"  # the session's target KV left the pool (dropped or tiered)
    RESUME = "resume"  # the session's next turn `request_id` was admitted: it takes the KV
    END = "end"  # the session is over (closed, aborted, expired): its draft KV is freed


@dataclass(frozen=True, slots=True)
class DraftOrder:
    kind: DraftOrderKind
    session_id: str
    request_id: str | None = None


class DraftKV(Protocol):
    """What DraftSessions needs of the draft proposer (heddle.spec.draft.DraftModelProposer)."""

    @property
    def num_free_blocks(self) -> int: ...

    def rename(self, old_id: str, new_id: str) -> bool: ...

    def blocks_held(self, request_id: str) -> int: ...

    def forget(self, request_ids: Iterable[str]) -> None: ...


def parked_key(session_id: str) -> str:
    """The proposer's key of a paused session's draft KV (no request id starts with NUL)."""
    return f"\0session:{session_id}"


@dataclass(slots=True)
class _DraftParked:
    session_id: str
    order: int  # parking order (the oldest first)
    target_in_pool: bool = True


@dataclass(slots=True)
class DraftSessionStats:
    num_parked: int = 0  # turns whose draft KV was kept for the session
    num_resumed: int = 0  # next turns that took their session's draft KV
    num_dropped_pressure: int = 0  # sessions whose draft KV gave way to a proposal
    blocks_dropped_pressure: int = 0
    num_ended: int = 0  # sessions whose draft KV was freed with the session


@dataclass(slots=True)
class DraftSessions:
    """Paused sessions' draft KV on the executor's side (see the module docstring)."""

    parked: dict[str, _DraftParked] = field(default_factory=dict)
    stats: DraftSessionStats = field(default_factory=DraftSessionStats)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def apply(self, orders: Sequence[DraftOrder], draft: DraftKV) -> None:
        """Apply one step's orders, in the order they happened (before the executor forgets
        the step's finished requests: a parked turn's KV is renamed, not freed)."""
        for order in orders:
            sid = order.session_id
            key = parked_key(sid)
            kind = order.kind
            if kind is DraftOrderKind.PARK:
                assert order.request_id is not None
                if sid in self.parked:  # a turn that ended without its predecessor's KV
                    draft.forget([key])
                    del self.parked[sid]
                if draft.rename(order.request_id, key):
                    self.parked[sid] = _DraftParked(sid, next(self._counter))
                    self.stats.num_parked += 1
            elif kind is DraftOrderKind.RESUME:
                assert order.request_id is not None
                if self.parked.pop(sid, None) is not None and draft.rename(key, order.request_id):
                    self.stats.num_resumed += 1
            elif kind is DraftOrderKind.END:
                if self.parked.pop(sid, None) is not None:
                    draft.forget([key])
                    self.stats.num_ended += 1
            elif (entry := self.parked.get(sid)) is not None:
                entry.target_in_pool = kind is DraftOrderKind.TARGET_POOL

    def release_order(self) -> list[str]:
        """Sessions in the order their draft KV gives way: target KV out of the pool first,
        then kept ones; the oldest first within each."""
        return [
            p.session_id
            for p in sorted(self.parked.values(), key=lambda p: (p.target_in_pool, p.order))
        ]

    def make_room(self, num_blocks: int, draft: DraftKV) -> int:
        """Drop parked draft KV (in `release_order`) until `num_blocks` draft blocks are free;
        returns the blocks freed."""
        freed = 0
        for sid in self.release_order():
            if draft.num_free_blocks >= num_blocks:
                break
            key = parked_key(sid)
            before = draft.num_free_blocks
            draft.forget([key])
            del self.parked[sid]
            self.stats.num_dropped_pressure += 1
            self.stats.blocks_dropped_pressure += draft.num_free_blocks - before
            freed += draft.num_free_blocks - before
        return freed

    def num_parked_blocks(self, draft: DraftKV) -> int:
        return sum(draft.blocks_held(parked_key(sid)) for sid in self.parked)
