"""Paged KV cache bookkeeping: fixed-size blocks, a free pool, block tables and a prefix cache.

Pure Python, no torch: the executor owns the memory, this module only decides which block ids
hold which tokens. A block is *full* when it holds `block_size` computed tokens; full blocks are
registered in the prefix cache under a hash chained from their parent's, so a later request with
the same prefix reuses them. Blocks whose reference count drops to zero go to the free pool in
LRU order but keep their cached contents until the pool hands them out again (lazy eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# Hash of the (empty) prefix before a request's first block.
ROOT_HASH = 0x6865646C65  # "hedle"


def chain_hash(parent_hash: int, block_token_ids: Sequence[int]) -> int:
    """Hash of a full block, chained so that equal hashes mean equal prefixes."""
    return hash((parent_hash, tuple(block_token_ids)))


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set while the block is registered in the prefix cache


class BlockPool:
    """All blocks, the free pool in eviction order, and the prefix cache's hash -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first; evicted from the front.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def allocate(self, count: int) -> list[KVBlock]:
        """Take `count` free blocks, evicting their cached contents. Caller checks capacity."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        taken = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            self._uncache(block)
            block.ref_count = 1
            taken.append(block)
        return taken

    def acquire(self, block: KVBlock) -> None:
        """Take a reference to a block found in the prefix cache (it may be free)."""
        if block.ref_count == 0:
            del self._free[block.block_id]
        block.ref_count += 1

    def release(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference to each block; in reverse, so a request's tail is evicted first."""
        for block in reversed(blocks):
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None

    def lookup(self, block_hash: int) -> KVBlock | None:
        return self._cached.get(block_hash)

    def register(self, block: KVBlock, block_hash: int) -> None:
        """Put a full, computed block in the prefix cache (first writer of a hash wins)."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def evict_cached(self, count: int) -> int:
        """Drop the cached contents of up to `count` free blocks, oldest first. Returns how many."""
        evicted = 0
        for block_id in self._free:
            if evicted == count:
                break
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._uncache(block)
                evicted += 1
        return evicted

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None

    def check_integrity(self) -> None:
        for block in self.blocks:
            in_free = block.block_id in self._free
            if block.ref_count < 0:
                raise AssertionError(f"block {block.block_id} has ref count {block.ref_count}")
            if in_free != (block.ref_count == 0):
                raise AssertionError(
                    f"block {block.block_id}: ref count {block.ref_count}, in free pool={in_free}"
                )
            if block.block_hash is not None and self._cached.get(block.block_hash) is not block:
                raise AssertionError(f"block {block.block_id} has a hash the cache does not map")
        for block_hash, block in self._cached.items():
            if block.block_hash != block_hash:
                raise AssertionError(f"cache maps hash to block {block.block_id} with another hash")


class KVCacheManager:
    """Per-request block tables over a BlockPool, with prefix caching.

    The scheduler talks to it through a few verbs: `find_cached_prefix`, `allocate_slots`,
    `commit_computed`, `free`, `fork`.
    """

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        # Per request, the ids of its blocks in position order. The scheduler hands these lists
        # to the executor as block tables without copying: nobody else may mutate them.
        self._tables: dict[str, list[int]] = {}
        # Chained hashes of each request's full blocks that are registered (or found) in the cache.
        self._hashes: dict[str, list[int]] = {}
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found

    # -- capacity ---------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.pool.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- verbs ------------------------------------------------------------------------------
    def find_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[KVBlock], list[int]]:
        """The longest run of cached full blocks that prefixes `token_ids`, with their hashes.

        At least one token is always left to compute, so the step that finishes the prompt
        has logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [], []
        max_blocks = (len(token_ids) - 1) // self.block_size
        blocks: list[KVBlock] = []
        hashes: list[int] = []
        parent = ROOT_HASH
        bs = self.block_size
        for i in range(max_blocks):
            parent = chain_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self.pool.lookup(parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(parent)
        return blocks, hashes

    def record_prefix_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_prompt_tokens
        self.prefix_hits += num_hit_tokens

    def allocate_slots(
        self,
        request_id: str,
        num_tokens: int,
        cached_blocks: Sequence[KVBlock] = (),
        cached_hashes: Sequence[int] = (),
    ) -> bool:
        """Make the request's block table cover `num_tokens` tokens.

        `cached_blocks` (from `find_cached_prefix`, only for a request with no table yet) are
        shared rather than allocated. Returns False, changing nothing, if the pool is short.
        """
        table = self._tables.get(request_id)
        if table is None:
            table = []
        elif cached_blocks:
            raise ValueError(f"request {request_id} already has blocks; cannot add cached ones")
        have = len(table) + len(cached_blocks)
        need = self.blocks_needed(num_tokens) - have
        # Cached blocks that sit in the free pool are taken out of it by acquiring them.
        reclaimed = sum(1 for b in cached_blocks if b.ref_count == 0)
        if need > 0 and need > self.pool.num_free_blocks - reclaimed:
            return False
        if request_id not in self._tables:
            self._tables[request_id] = table
            self._hashes[request_id] = list(cached_hashes)
        for block in cached_blocks:
            self.pool.acquire(block)
            table.append(block.block_id)
        if need > 0:
            table.extend(b.block_id for b in self.pool.allocate(need))
        return True

    def commit_computed(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Register the request's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[request_id]
        hashes = self._hashes[request_id]
        num_full = min(num_computed // self.block_size, len(table))
        bs = self.block_size
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), num_full):
            parent = chain_hash(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
            self.pool.register(self.pool.blocks[table[i]], parent)

    def free(self, request_id: str) -> None:
        """Release every block of the request. Cached blocks stay findable until evicted."""
        table = self._tables.pop(request_id, None)
        self._hashes.pop(request_id, None)
        if table:
            blocks = self.pool.blocks
            self.pool.release([blocks[i] for i in table])

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> int:
        """Give `child_id` shared references to the parent's full blocks among its first
        `num_tokens` tokens, leaving at least one token for the child to compute.

        Returns the number of tokens the child starts with as computed.
        """
        if child_id in self._tables:
            raise ValueError(f"request {child_id} already has blocks")
        parent = self._tables[parent_id]
        num_shared = min((num_tokens - 1) // self.block_size, len(parent))
        shared = parent[:num_shared]
        for block_id in shared:
            self.pool.acquire(self.pool.blocks[block_id])
        self._tables[child_id] = list(shared)
        self._hashes[child_id] = list(self._hashes[parent_id][:num_shared])
        return num_shared * self.block_size

    def evict_cached(self, count: int) -> int:
        return self.pool.evict_cached(count)

    # -- queries ----------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (the live list: read it, never mutate it)."""
        return self._tables.get(request_id, [])

    def num_request_blocks(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def check_integrity(self) -> None:
        """Ref counts equal the number of tables holding each block; nothing in use is free."""
        self.pool.check_integrity()
        holders = [0] * self.pool.num_blocks
        for request_id, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"request {request_id} holds a block twice")
            for block_id in table:
                holders[block_id] += 1
        for block in self.pool.blocks:
            if block.ref_count != holders[block.block_id]:
                raise AssertionError(
                    f"block {block.block_id}: ref count {block.ref_count}, "
                    f"held by {holders[block.block_id]} tables"
                )
