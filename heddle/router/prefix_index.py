"""The router's approximate picture of which replica's prefix cache holds which blocks.

Like SGLang's `cache_aware` router (an approximate radix tree per worker), the router never asks
a replica what it caches: it remembers what it sent where. Blocks are keyed by the engine's
chained block hash, so a hash stands for a whole prefix and "the longest cached prefix" is a walk
along a request's hashes until no replica holds the next one. Each replica's entries are kept in
LRU order and bounded by its KV capacity (`capacity_blocks`, None: unbounded), which mimics the
replica's own eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from heddle.core.block_hash import BlockHash


class PrefixIndex:
    def __init__(self, capacity_blocks: int | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self._holders: dict[BlockHash, set[int]] = {}  # block hash -> replicas holding it
        # replica -> its hashes, oldest first
        self._lru: dict[int, OrderedDict[BlockHash, None]] = {}

    def insert(self, replica_id: int, block_hashes: Iterable[BlockHash]) -> None:
        """`replica_id` now holds these blocks (most recently used)."""
        lru = self._lru.setdefault(replica_id, OrderedDict())
        for block_hash in block_hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
                continue
            lru[block_hash] = None
            self._holders.setdefault(block_hash, set()).add(replica_id)
        if self.capacity_blocks is not None:
            while len(lru) > self.capacity_blocks:
                old, _ = lru.popitem(last=False)
                self._drop(old, replica_id)

    def remove_replica(self, replica_id: int) -> None:
        """Forget everything a replica held (it died: its cache is gone)."""
        for block_hash in self._lru.pop(replica_id, ()):
            self._drop(block_hash, replica_id)

    def _drop(self, block_hash: BlockHash, replica_id: int) -> None:
        holders = self._holders.get(block_hash)
        if holders is None:
            return
        holders.discard(replica_id)
        if not holders:
            del self._holders[block_hash]

    def num_blocks(self, replica_id: int) -> int:
        return len(self._lru.get(replica_id, ()))

    def match(self, block_hashes: Sequence[BlockHash], candidates: Iterable[int]) -> dict[int, int]:
        """Leading blocks of `block_hashes` each candidate holds (only those holding >= 1)."""
        alive = set(candidates)
        matched: dict[int, int] = {}
        depth = 0
        for block_hash in block_hashes:
            holders = self._holders.get(block_hash)
            still = alive & holders if holders else set()
            if depth:
                for replica_id in alive - still:
                    matched[replica_id] = depth
            alive = still
            if not alive:
                break
            depth += 1
        if depth:
            for replica_id in alive:
                matched[replica_id] = depth
        return matched

    def touch(self, replica_id: int, block_hashes: Sequence[BlockHash]) -> None:
        """Mark blocks the replica already holds as just used (a cache hit keeps them warm)."""
        lru = self._lru.get(replica_id)
        if lru is None:
            return
        for block_hash in block_hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
