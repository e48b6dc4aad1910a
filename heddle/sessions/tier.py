"""The second KV tier: a bounded store outside the pool where parked sessions' blocks wait.

OFFLOAD moves a parked session's blocks out of the pool: their contents are copied into slots
of the tier and the pool blocks are freed (to the free list, still cached until reused). When
the session's next turn is admitted, whatever of its context is no longer in the pool gets
fresh blocks, the executor copies the slots back in, and the blocks are registered in the
prefix cache under their old hashes: the turn then finds its whole context as a cached prefix
and computes only its new tokens. The tier is host memory beside a GPU pool; on a CPU-only
engine a buffer outside the pool (the same mechanism; the copy costs memory bandwidth).

This module only decides which slot holds which block; the copies are orders in the step's
`SchedulerOutput` (`offload_blocks`, `restore_blocks`) that the executor carries out before
the step's forward pass, out-copies first. Ordering rules that keep the copies right:

- a pool block freed by an offload may be handed out in the same step: its out-copy is made
  before the forward pass writes into it (out-copies run first);
- a slot freed by a restore (or a release) is reused only after the step that reads it has
  been sent (`take_copies` frees it then): a later out-copy never overwrites a slot whose
  in-copy is still to be made;
- orders are sent only with a step that runs something (an empty step is not executed): a
  freed block is only written by a step that runs, and that step carries the orders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heddle.core.block_hash import BlockHash


@dataclass(slots=True)
class Offloaded:
    """A session's context in the tier: per block of its chain (in order), its hash and the
    slot that holds its copy, or None for a block that stayed in the pool (others held it)."""

    chain: list[tuple[BlockHash, int | None]]

    @property
    def slots(self) -> list[int]:
        return [slot for _, slot in self.chain if slot is not None]


@dataclass(slots=True)
class TierStats:
    num_offloaded: int = 0  # sessions moved to the tier
    blocks_offloaded: int = 0  # blocks copied out
    num_restored: int = 0  # sessions whose next turn copied blocks back in
    blocks_restored: int = 0  # blocks copied in
    blocks_found_in_pool: int = 0  # offloaded blocks a restore found still cached in the pool


@dataclass(slots=True)
class SecondTier:
    """`num_slots` blocks' worth of room outside the pool, and the copy orders not yet sent."""

    num_slots: int
    _free: list[int] = field(default_factory=list)
    _freeing: list[int] = field(default_factory=list)  # freed this step: reusable after it
    offload_orders: list[tuple[int, int]] = field(default_factory=list)  # (block id, slot)
    restore_orders: list[tuple[int, int]] = field(default_factory=list)  # (slot, block id)
    stats: TierStats = field(default_factory=TierStats)

    def __post_init__(self) -> None:
        if self.num_slots < 0:
            raise ValueError("the second tier's size must be >= 0 blocks")
        self._free = list(range(self.num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        return self.num_slots - len(self._free) - len(self._freeing)

    def take_slot(self) -> int:
        if not self._free:
            raise RuntimeError("the second tier is full")
        return self._free.pop()

    def release(self, slots: list[int]) -> None:
        """Slots whose copies are no longer wanted (reusable once this step's orders are sent)."""
        self._freeing.extend(slots)

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The copy orders for the step being sent, out-copies first; slots freed until now
        become reusable after it."""
        out, back = self.offload_orders, self.restore_orders
        self.offload_orders, self.restore_orders = [], []
        self._free.extend(self._freeing)
        self._freeing.clear()
        return out, back

    def check_integrity(self, held: list[list[int]]) -> None:
        """Every slot is free, being freed, or held by exactly one offloaded session."""
        seen = [s for slots in held for s in slots]
        everything = seen + self._free + self._freeing
        if sorted(everything) != list(range(self.num_slots)):
            raise AssertionError(
                f"second tier: {len(seen)} held, {len(self._free)} free, "
                f"{len(self._freeing)} freeing of {self.num_slots} slots (lost or doubled)"
            )
