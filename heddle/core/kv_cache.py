"""Paged KV cache bookkeeping: fixed-size blocks, a free pool, block tables and a prefix cache.

Pure Python, no torch: the executor owns the memory, this module only decides which block ids
hold which tokens. A block is *full* when it holds `block_size` computed tokens; full blocks are
registered in the prefix cache under a hash chained from their parent's, so a later request with
the same prefix reuses them. Blocks whose reference count drops to zero go to the free pool in
LRU order but keep their cached contents until the pool hands them out again (lazy eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from heddle.core.block_hash import BlockHash, hash_block_tokens, root_hash


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None  # set while the block is registered in the prefix cache


class BlockPool:
    """All blocks, the free pool in eviction order, and the prefix cache's hash -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first; evicted from the front.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, KVBlock] = {}

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

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def register(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Put a full, computed block in the prefix cache (first writer of a hash wins)."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

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
    `commit_computed`, `free`.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        namespace: str = "",
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # What besides the tokens makes this engine's KV differ (the model): mixed into every
        # request's root hash.
        self.namespace = namespace
        self.pool = BlockPool(num_blocks)
        # Per request, the ids of its blocks in position order. The scheduler hands these lists
        # to the executor as block tables without copying: nobody else may mutate them.
        self._tables: dict[str, list[int]] = {}
        # Chained hashes of each request's full blocks that are registered (or found) in the cache.
        self._hashes: dict[str, list[BlockHash]] = {}
        self._roots: dict[str, BlockHash] = {}
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

    def root_hash(self, cache_salt: str | None = None) -> BlockHash:
        return root_hash(self.namespace, cache_salt)

    # -- verbs ------------------------------------------------------------------------------
    def find_cached_prefix(
        self, token_ids: Sequence[int], cache_salt: str | None = None
    ) -> tuple[list[KVBlock], list[BlockHash]]:
        """The longest run of cached full blocks that prefixes `token_ids`, with their hashes.

        At least one token is always left to compute, so the step that finishes the prompt
        has logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [], []
        max_blocks = (len(token_ids) - 1) // self.block_size
        blocks: list[KVBlock] = []
        hashes: list[BlockHash] = []
        parent = self.root_hash(cache_salt)
        bs = self.block_size
        for i in range(max_blocks):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs])
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
        cached_hashes: Sequence[BlockHash] = (),
        cache_salt: str | None = None,
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
            self._roots[request_id] = self.root_hash(cache_salt)
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
        parent = hashes[-1] if hashes else self._roots[request_id]
        for i in range(len(hashes), num_full):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
            self.pool.register(self.pool.blocks[table[i]], parent)

    def free(self, request_id: str) -> None:
        """Release every block of the request. Cached blocks stay findable until evicted."""
        table = self._tables.pop(request_id, None)
        self._hashes.pop(request_id, None)
        self._roots.pop(request_id, None)
        if table:
            blocks = self.pool.blocks
            self.pool.release([blocks[i] for i in table])

    # -- queries ----------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (the live list: read it, never mutate it)."""
        return self._tables.get(request_id, [])

    def num_request_blocks(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def check_integrity(self, num_computed: Mapping[str, int] | None = None) -> None:
        """Raise AssertionError where the bookkeeping is inconsistent.

        The pool: ref counts equal the number of tables holding each block, nothing in use is
        free, the hash map and the blocks agree. Per request: its hash list covers a prefix of
        its table. With `num_computed` (request id -> tokens with KV, for every request the
        scheduler runs): exactly those requests hold tables, each table covers its computed
        tokens, the computed full blocks are the registered ones, and every block a request
        will still write (from its first uncomputed position on) is its alone and unregistered.
        """
        self.pool.check_integrity()
        holders = [0] * self.pool.num_blocks
        blocks = self.pool.blocks
        bs = self.block_size
        if self._hashes.keys() != self._tables.keys() or self._roots.keys() != self._tables.keys():
            raise AssertionError("block tables and hash lists are kept for different requests")
        for request_id, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"request {request_id} holds a block twice")
            for block_id in table:
                holders[block_id] += 1
            hashes = self._hashes[request_id]
            if len(hashes) > len(table):
                raise AssertionError(f"request {request_id} has more block hashes than blocks")
            for block_id, block_hash in zip(table, hashes, strict=False):
                # Unregistered is fine: when two requests compute the same block, the first
                # one's copy is registered.
                if blocks[block_id].block_hash not in (None, block_hash):
                    raise AssertionError(
                        f"request {request_id}: block {block_id} is cached under another hash"
                    )
        for block in blocks:
            if block.ref_count != holders[block.block_id]:
                raise AssertionError(
                    f"block {block.block_id}: ref count {block.ref_count}, "
                    f"held by {holders[block.block_id]} tables"
                )
        if num_computed is None:
            return
        if self._tables.keys() != num_computed.keys():
            extra = sorted(self._tables.keys() - num_computed.keys())
            missing = sorted(num_computed.keys() - self._tables.keys())
            raise AssertionError(
                f"block tables held by requests that do not run: {extra}; running without: "
                f"{missing}"
            )
        for request_id, computed in num_computed.items():
            table = self._tables[request_id]
            if len(table) * bs < computed:
                raise AssertionError(
                    f"request {request_id}: {computed} computed tokens, {len(table)} blocks"
                )
            if self.enable_prefix_caching and len(self._hashes[request_id]) != min(
                computed // bs, len(table)
            ):
                raise AssertionError(
                    f"request {request_id}: {computed // bs} computed full blocks, "
                    f"{len(self._hashes[request_id])} registered"
                )
            for block_id in table[computed // bs :]:
                block = blocks[block_id]
                if block.ref_count != 1 or block.block_hash is not None:
                    raise AssertionError(
                        f"request {request_id} will write into block {block_id}, which is "
                        f"{'shared' if block.ref_count != 1 else 'registered'}"
                    )
