"""Retention policies: what happens to a paused session's KV — keep it, offload it, drop it.

The mechanism (heddle/sessions/manager.py) parks a session's blocks when its turn ends and asks
a policy two things: what to do with a session as it parks (`on_park`), and, when requests need
memory that parked sessions hold, which sessions give it up and how (`reclaim_order`). Policies
see plain numbers (`ParkedView`, `Pressure`) and the engine's costs (`Costs`), never blocks.

- `lru`: today's engines. Nothing is parked: a finished turn's blocks go to the free list in
  LRU order, findable by the prefix cache until reused.
- `ttl`: a fixed pin (Continuum-like). Every session is kept for `ttl` seconds, whatever the
  pressure, then released to the free list.
- `cost`: heddle's decision, InferCept's waste measure (Abhyankar et al., ICML'24) in
  block-seconds: keeping wastes the blocks others want (`min(held, shortage)`) for the expected
  *remaining* pause (heddle.sessions.pauses: it grows while a heavy-tailed tool runs long);
  dropping wastes the recompute time of the context (the executor's cost model) times the
  memory of the batch it stalls plus its own; offloading wastes the copy time (the second
  tier's bandwidth) likewise, while the tier has room. No pressure, no waste in keeping. Under
  pressure sessions give their memory up in order of what keeping them wastes, not LRU.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heddle.errors import HeddleError


class Retention(enum.Enum):
    KEEP = "keep"  # blocks stay in the pool, held by the session
    OFFLOAD = "offload"  # blocks are copied to the second tier and freed in the pool
    DROP = "drop"  # blocks go to the free list (the prefix cache may still find them)


@dataclass(frozen=True, slots=True)
class ParkedView:
    """What a policy sees of one parked session."""

    session_id: str
    num_blocks: int  # blocks it holds in the pool (0 once offloaded)
    num_tokens: int  # tokens of context those blocks hold
    parked_at: float
    expected_remaining: float  # seconds its pause is still expected to last
    offloaded: bool = False


@dataclass(frozen=True, slots=True)
class Pressure:
    """Demand for pool memory at a decision."""

    num_free_blocks: int
    num_blocks_wanted: int  # by requests waiting for memory (running growth included)
    num_waiting: int  # requests that cannot start for lack of memory
    num_host_free_blocks: int = 0  # room left in the second tier
    num_running_blocks: int = 0  # blocks of the running requests (the batch a recompute stalls)

    @property
    def shortage(self) -> int:
        return max(0, self.num_blocks_wanted - self.num_free_blocks)


@dataclass(frozen=True, slots=True)
class Costs:
    """The engine's costs, in seconds: recompute of n tokens, copy of n blocks out and back."""

    recompute_seconds: Callable[[int], float]
    copy_seconds: Callable[[int], float] | None = None  # None: no second tier


class RetentionPolicy:
    name = "base"
    parks = True  # False: finished turns release their blocks at once (no parking)
    pin_seconds: float | None = None  # a fixed pin: sessions are released after this long

    def on_park(self, view: ParkedView, pressure: Pressure, costs: Costs) -> Retention:
        return Retention.KEEP

    def reclaim_order(
        self, parked: Sequence[ParkedView], pressure: Pressure, costs: Costs, *, must: bool
    ) -> list[tuple[ParkedView, Retention]]:
        """Sessions that give up pool memory now, in order, and how. `must`: a running request
        needs the blocks (otherwise one is preempted), not only a waiting one."""
        return []

    def pin_expired(self, view: ParkedView, now: float) -> bool:
        """Whether a kept session's pin ran out (released to the free list)."""
        return self.pin_seconds is not None and now - view.parked_at >= self.pin_seconds


class LRURetention(RetentionPolicy):
    """No parking: what engines do today."""

    name = "lru"
    parks = False

    def on_park(self, view: ParkedView, pressure: Pressure, costs: Costs) -> Retention:
        return Retention.DROP


class TTLRetention(RetentionPolicy):
    """Keep every session for `ttl` seconds (Continuum's pin), then release it."""

    name = "ttl"

    def __init__(self, ttl: float = 2.0) -> None:
        if not ttl > 0:
            raise HeddleError(f"retention ttl must be positive, got {ttl}")
        self.ttl = self.pin_seconds = float(ttl)

    def reclaim_order(
        self, parked: Sequence[ParkedView], pressure: Pressure, costs: Costs, *, must: bool
    ) -> list[tuple[ParkedView, Retention]]:
        """A pin holds against waiting requests; a running one that would be preempted takes
        the oldest pins first."""
        if not must:
            return []
        ordered = sorted(parked, key=lambda v: (v.parked_at, v.session_id))
        return [(view, Retention.DROP) for view in ordered if view.num_blocks > 0]


class CostRetention(RetentionPolicy):
    """Keep, offload or drop, whichever wastes least (see the module docstring)."""

    name = "cost"

    def __init__(self, recompute_weight: float = 1.0, copy_weight: float = 1.0) -> None:
        if recompute_weight <= 0 or copy_weight <= 0:
            raise HeddleError("retention weights must be positive")
        self.recompute_weight = float(recompute_weight)
        self.copy_weight = float(copy_weight)

    def keep_cost(self, view: ParkedView, pressure: Pressure) -> float:
        """Block-seconds that waiting work is kept from while this session holds its blocks."""
        shortage = pressure.shortage
        if shortage <= 0 or view.num_blocks <= 0:
            return 0.0
        return view.expected_remaining * min(view.num_blocks, shortage)

    def _stalled_blocks(self, view: ParkedView, pressure: Pressure) -> int:
        return pressure.num_running_blocks + view.num_blocks

    def drop_cost(self, view: ParkedView, pressure: Pressure, costs: Costs) -> float:
        seconds = costs.recompute_seconds(view.num_tokens)
        return self.recompute_weight * seconds * self._stalled_blocks(view, pressure)

    def offload_cost(self, view: ParkedView, pressure: Pressure, costs: Costs) -> float:
        if costs.copy_seconds is None or view.num_blocks > pressure.num_host_free_blocks:
            return math.inf
        seconds = costs.copy_seconds(view.num_blocks)
        return self.copy_weight * seconds * self._stalled_blocks(view, pressure)

    def release_choice(
        self, view: ParkedView, pressure: Pressure, costs: Costs
    ) -> tuple[Retention, float]:
        """How this session would give its memory up, and what that costs."""
        offload = self.offload_cost(view, pressure, costs)
        drop = self.drop_cost(view, pressure, costs)
        return (Retention.OFFLOAD, offload) if offload <= drop else (Retention.DROP, drop)

    def on_park(self, view: ParkedView, pressure: Pressure, costs: Costs) -> Retention:
        keep = self.keep_cost(view, pressure)
        choice, cost = self.release_choice(view, pressure, costs)
        return Retention.KEEP if keep <= cost else choice

    def reclaim_order(
        self, parked: Sequence[ParkedView], pressure: Pressure, costs: Costs, *, must: bool
    ) -> list[tuple[ParkedView, Retention]]:
        scored = []
        for view in parked:
            if view.offloaded or view.num_blocks <= 0:
                continue
            choice, cost = self.release_choice(view, pressure, costs)
            benefit = self.keep_cost(view, pressure) - cost
            if must or benefit > 0:
                scored.append((-benefit, view.parked_at, view.session_id, view, choice))
        scored.sort(key=lambda s: s[:3])
        return [(view, choice) for *_, view, choice in scored]


RETENTION_POLICIES: dict[str, type[RetentionPolicy]] = {
    "lru": LRURetention,
    "ttl": TTLRetention,
    "cost": CostRetention,
}


def make_retention(name: str, **options: object) -> RetentionPolicy:
    cls = RETENTION_POLICIES.get(name)
    if cls is None:
        raise HeddleError(
            f"unknown retention policy {name!r}; known: {', '.join(RETENTION_POLICIES)}"
        )
    try:
        return cls(**options)
    except TypeError as e:
        raise HeddleError(f"bad options for retention policy {name!r}: {e}") from e
