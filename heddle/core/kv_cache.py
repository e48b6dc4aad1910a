"""Paged KV cache bookkeeping: fixed-size blocks, a free pool, block tables and a prefix cache.

Pure Python, no torch: the executor owns the memory, this module only decides which block ids
hold which tokens. A block is *full* when it holds `block_size` computed tokens; full blocks are
registered in the prefix cache under a hash chained from their parent's, so a later request with
the same prefix reuses them. Blocks whose reference count drops to zero go to the free pool in
LRU order but keep their cached contents until the pool hands them out again (lazy eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, MutableSequence, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heddle.core.block_hash import BlockHash, block_hasher, root_hash

# `Request.commit_at` without prefix caching: nothing is ever committed.
_NEVER_COMMIT = 1 << 62
_ROOT_HASHES_KEPT = 1024  # cache salts whose root hash is kept (KVCacheManager._root_hashes)

if TYPE_CHECKING:
    from heddle.core.events import DecisionLog
    from heddle.request import Request


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
        self.num_evictions = 0  # cached blocks whose contents were dropped to reuse the block
        # Free blocks that still hold a cached prefix (the view's KV map), kept as they move.
        self.num_cached_free_blocks = 0
        # When set (a decision log's two lists): each evicted block's id, the request it went to.
        self.eviction_log: tuple[MutableSequence[int], list[str]] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def allocate(self, count: int, for_request: str = "") -> list[KVBlock]:
        """Take `count` free blocks for `for_request`, evicting their cached contents. Caller
        checks capacity."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        taken = []
        log = self.eviction_log
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._uncache(block)
                self.num_cached_free_blocks -= 1
                if log is not None:
                    log[0].append(block_id)
                    log[1].append(for_request)
            block.ref_count = 1
            taken.append(block)
        return taken

    def acquire(self, block: KVBlock) -> None:
        """Take a reference to a block found in the prefix cache (it may be free)."""
        if block.ref_count == 0:
            del self._free[block.block_id]
            if block.block_hash is not None:
                self.num_cached_free_blocks -= 1
        block.ref_count += 1

    def release(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference to each block; in reverse, so a request's tail is evicted first."""
        for block in reversed(blocks):
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                if block.block_hash is not None:
                    self.num_cached_free_blocks += 1

    def release_ids(self, block_ids: Sequence[int]) -> None:
        """`release` of the blocks with these ids (a block table), without building the list."""
        blocks, free = self.blocks, self._free
        cached = 0  # of the blocks freed, those that stay cached: counted once, at the end
        for block_id in reversed(block_ids):
            block = blocks[block_id]
            count = block.ref_count - 1
            if count < 0:
                self.num_cached_free_blocks += cached
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_count = count
            if not count:
                free[block_id] = None
                if block.block_hash is not None:
                    cached += 1
        self.num_cached_free_blocks += cached

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def register(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Put a full, computed block in the prefix cache (first writer of a hash wins)."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block
        if block.ref_count == 0:
            self.num_cached_free_blocks += 1

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
            self.num_evictions += 1

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
        cached_free = sum(1 for i in self._free if self.blocks[i].block_hash is not None)
        if cached_free != self.num_cached_free_blocks:
            raise AssertionError(
                f"{cached_free} free blocks hold a cached prefix, the count says "
                f"{self.num_cached_free_blocks}"
            )


class KVCacheManager:
    """Per-request block tables over a BlockPool, with prefix caching.

    The scheduler talks to it through a few verbs: `find_cached_prefix`, `allocate_slots`,
    `commit_computed`, `free`. It keeps each request's block table; on the request it keeps
    what the scheduler's fast path reads without a call (`num_slots`: tokens the table can
    hold; `num_committed_blocks`) and the request's block hashes, which are computed once per
    full block and survive preemption.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        namespace: str = "",
        block_hash: str = "sha256",
    ) -> None:
        """`block_hash`: "sha256" (safe against crafted prompts: the server's) or "builtin"
        (Python's tuple hash, cheaper: the simulator's); see heddle/core/block_hash.py."""
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_hash = block_hash
        self._hash_block = block_hasher(block_hash)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # What besides the tokens makes this engine's KV differ (the model): mixed into every
        # request's root hash.
        self.namespace = namespace
        # The root hash per cache salt: one SHA-256 per salt, not one per request (at most
        # `_ROOT_HASHES_KEPT` salts, so a server's clients cannot grow it without bound).
        self._root_hashes: dict[str | None, BlockHash] = {}
        self.pool = BlockPool(num_blocks)
        # Per request, the ids of its blocks in position order (the live list: read it, never
        # mutate it; the scheduler sends the executor copies of the new entries).
        self._tables: dict[str, list[int]] = {}
        self._events: DecisionLog | None = None  # the scheduler's, told of evictions
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found
        # Parked sessions (heddle/sessions): per session, the cached full blocks of its last
        # context, held (one reference each) so that they stay out of the free pool.
        self._parked: dict[str, list[int]] = {}
        self._parked_refs: dict[int, int] = {}  # block id -> sessions parking it

    @property
    def events(self) -> DecisionLog | None:
        return self._events

    @events.setter
    def events(self, log: DecisionLog | None) -> None:
        """Evictions go straight into the log's flat lists: the pool appends each evicted
        block's id and the request it went to (no call into the log, no object per
        allocation)."""
        self._events = log
        self.pool.eviction_log = None if log is None else (log.evicted_blocks, log.evicted_for)

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

    def _commit_at(self, num_committed_blocks: int) -> int:
        """`Request.commit_at` for a request with that many committed blocks."""
        if not self.enable_prefix_caching:
            return _NEVER_COMMIT
        return (num_committed_blocks + 1) * self.block_size

    # -- hashes -----------------------------------------------------------------------------
    def _block_hash(self, request: Request, index: int) -> BlockHash:
        """The hash of the request's block `index` (a full block), computing the chain up to it
        the first time it is asked for."""
        hashes = request.block_hashes
        if index < len(hashes):
            return hashes[index]
        parent = hashes[-1] if hashes else request.root_hash
        if parent is None:
            parent = self._root_hashes.get(request.cache_salt)
            if parent is None:
                if len(self._root_hashes) >= _ROOT_HASHES_KEPT:  # salts come from clients
                    self._root_hashes.clear()
                parent = self._root_hashes[request.cache_salt] = root_hash(
                    self.namespace, request.cache_salt, self.block_hash
                )
            request.root_hash = parent
        tokens, bs = request.all_token_ids, self.block_size
        hash_block = self._hash_block
        for i in range(len(hashes), index + 1):
            parent = hash_block(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        return parent

    # -- verbs ------------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        """The longest run of cached full blocks that prefixes the request's tokens.

        At least one token is always left to compute, so the step that finishes the prompt
        has logits to sample from. Hashes are computed only as far as the lookup goes.
        """
        if not self.enable_prefix_caching:
            return []
        blocks: list[KVBlock] = []
        lookup = self.pool.lookup
        for i in range((request.num_tokens - 1) // self.block_size):
            block = lookup(self._block_hash(request, i))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def record_prefix_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_prompt_tokens
        self.prefix_hits += num_hit_tokens

    def allocate_slots(
        self, request: Request, num_tokens: int, cached_blocks: Sequence[KVBlock] = ()
    ) -> bool:
        """Make the request's block table cover `num_tokens` tokens.

        `cached_blocks` (from `find_cached_prefix`, only for a request with no table yet) are
        shared rather than allocated. Returns False, changing nothing, if the pool is short.
        """
        request_id = request.request_id
        table = self._tables.get(request_id)
        if table is None:
            table = []
        elif cached_blocks:
            raise ValueError(f"request {request_id} already has blocks; cannot add cached ones")
        have = len(table) + len(cached_blocks)
        need = -(-num_tokens // self.block_size) - have
        # Cached blocks that sit in the free pool are taken out of it by acquiring them.
        reclaimed = sum(1 for b in cached_blocks if b.ref_count == 0)
        if need > 0 and need > self.pool.num_free_blocks - reclaimed:
            return False
        if request_id not in self._tables:
            self._tables[request_id] = table
            request.num_committed_blocks = len(cached_blocks)
            request.commit_at = self._commit_at(len(cached_blocks))
        for block in cached_blocks:
            self.pool.acquire(block)
            table.append(block.block_id)
        if need > 0:
            table.extend(b.block_id for b in self.pool.allocate(need, request_id))
        request.num_slots = len(table) * self.block_size
        return True

    def append_block(self, request: Request) -> bool:
        """One more block at the end of the table of a request that has one and whose table is
        full: what `allocate_slots(request, num_slots + 1)` does, without its general case
        (the decode that crosses a block boundary). False, changing nothing, if none is free."""
        table = self._tables.get(request.request_id)
        pool = self.pool
        free = pool._free
        if table is None or not free:
            return False
        block_id, _ = free.popitem(last=False)
        block = pool.blocks[block_id]
        if block.block_hash is not None:
            pool._uncache(block)
            pool.num_cached_free_blocks -= 1
            log = pool.eviction_log
            if log is not None:
                log[0].append(block_id)
                log[1].append(request.request_id)
        block.ref_count = 1
        table.append(block_id)
        request.num_slots += self.block_size
        return True

    def commit_computed(self, request: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[request.request_id]
        committed = request.num_committed_blocks
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        if num_full == committed + 1 and committed == len(request.block_hashes) and committed:
            # The usual case (a decode that filled one block): one hash from the last one,
            # what `_block_hash` does, without its general loop.
            bs = self.block_size
            tokens = request.all_token_ids[committed * bs : num_full * bs]
            block_hash = self._hash_block(request.block_hashes[-1], tokens)
            request.block_hashes.append(block_hash)
            self.pool.register(self.pool.blocks[table[committed]], block_hash)
            request.num_committed_blocks = num_full
            request.commit_at = (num_full + 1) * bs
            return
        blocks = self.pool.blocks
        for i in range(committed, num_full):
            self.pool.register(blocks[table[i]], self._block_hash(request, i))
        if num_full > committed:
            request.num_committed_blocks = num_full
            request.commit_at = (num_full + 1) * self.block_size

    def free(self, request: Request) -> None:
        """Release every block of the request. Cached blocks stay findable until evicted."""
        table = self._tables.pop(request.request_id, None)
        request.num_slots = 0
        request.num_committed_blocks = 0
        request.commit_at = self._commit_at(0)
        if table:
            self.pool.release_ids(table)

    # -- parked sessions --------------------------------------------------------------------
    def park(self, session_id: str, request: Request) -> int:
        """Hold the request's cached full blocks for `session_id` (call before `free`): they
        stay out of the free pool, findable by the prefix cache, until `unpark`. A session
        parks one context; parking again replaces it. Returns the number of blocks held."""
        held: list[int] = []
        lookup = self.pool.lookup
        for block_hash in request.block_hashes[: request.num_committed_blocks]:
            block = lookup(block_hash)
            if block is None:
                break  # the chain is cut: later blocks could never be found from the root
            self.pool.acquire(block)
            held.append(block.block_id)
        self._hold_parked(session_id, held)
        return len(held)

    def _hold_parked(self, session_id: str, held: list[int]) -> None:
        """Make `held` (blocks the caller acquired) the session's parked blocks, replacing what
        it parked before."""
        self.unpark(session_id)
        if held:
            self._parked[session_id] = held
            refs = self._parked_refs
            for block_id in held:
                refs[block_id] = refs.get(block_id, 0) + 1

    def unpark(self, session_id: str) -> int:
        """Release a session's parked blocks to the free pool (their contents stay cached
        until the pool reuses them). Returns how many blocks it held."""
        held = self._parked.pop(session_id, None)
        if not held:
            return 0
        blocks = self.pool.blocks
        self.pool.release([blocks[i] for i in held])
        refs = self._parked_refs
        for block_id in held:
            if refs[block_id] == 1:
                del refs[block_id]
            else:
                refs[block_id] -= 1
        return len(held)

    def parked_chain(self, session_id: str) -> list[tuple[BlockHash, int, bool]]:
        """A parked session's blocks in order: (hash, block id, held by the session alone)."""
        blocks = self.pool.blocks
        chain = []
        for block_id in self._parked.get(session_id, ()):
            block = blocks[block_id]
            assert block.block_hash is not None  # parked blocks are cached (check_integrity)
            chain.append((block.block_hash, block_id, block.ref_count == 1))
        return chain

    def restore_parked(
        self, session_id: str, chain: Sequence[tuple[BlockHash, int | None]]
    ) -> list[tuple[int, int]] | None:
        """Park a context again from copies outside the pool (the second tier). `chain`: per
        block in order, its hash and the slot of its copy (None: no copy). Blocks still cached
        are held as they are; missing ones with a copy get fresh blocks, registered under their
        hash; the chain ends at the first block that is neither. Returns the (slot, block id)
        copies to make before the blocks are read, or None (nothing changed) when the free
        pool is short."""
        found, needed = self._restore_plan(chain)
        if needed > self.pool.num_free_blocks:
            return None
        missing = sum(1 for b in found if b is None)
        for block in found:
            if block is not None:
                self.pool.acquire(block)
        fresh = iter(self.pool.allocate(missing, session_id))  # evictions logged for it
        held, copies = [], []
        for (block_hash, slot), block in zip(chain, found, strict=False):
            if block is None:
                block = next(fresh)
                self.pool.register(block, block_hash)
                assert slot is not None
                copies.append((slot, block.block_id))
            held.append(block.block_id)
        self._hold_parked(session_id, held)
        return copies

    def free_blocks_to_restore(self, chain: Sequence[tuple[BlockHash, int | None]]) -> int:
        """Free blocks `restore_parked(chain)` needs (copies to place, cached free ones)."""
        return self._restore_plan(chain)[1]

    def _restore_plan(
        self, chain: Sequence[tuple[BlockHash, int | None]]
    ) -> tuple[list[KVBlock | None], int]:
        lookup = self.pool.lookup
        found: list[KVBlock | None] = []
        for block_hash, slot in chain:
            block = lookup(block_hash)
            if block is None and slot is None:
                break
            found.append(block)
        # Cached blocks that sit in the free pool leave it when acquired.
        needed = sum(1 for b in found if b is None or b.ref_count == 0)
        return found, needed

    def parked_block_ids(self, session_id: str) -> list[int]:
        return self._parked.get(session_id, [])

    def num_freeable_parked_blocks(self, session_id: str) -> int:
        """Blocks that unparking the session would return to the free pool (held by it alone)."""
        blocks = self.pool.blocks
        return sum(1 for i in self._parked.get(session_id, ()) if blocks[i].ref_count == 1)

    @property
    def num_parked_blocks(self) -> int:
        """Distinct blocks held by parked sessions."""
        return len(self._parked_refs)

    @property
    def parked_sessions(self) -> list[str]:
        return list(self._parked)

    # -- queries ----------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (the live list: read it, never mutate it)."""
        return self._tables.get(request_id, [])

    def cached_block_ids(self, request: Request) -> list[int]:
        """The request's blocks that are in the prefix cache (findable after it frees them)."""
        table = self._tables.get(request.request_id, ())
        blocks = self.pool.blocks
        committed = table[: request.num_committed_blocks]
        return [b for b in committed if blocks[b].block_hash is not None]

    def num_request_blocks(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def check_integrity(self, running: Iterable[Request] | None = None) -> None:
        """Raise AssertionError where the bookkeeping is inconsistent.

        The pool: ref counts equal the number of tables holding each block, nothing in use is
        free, the hash map and the blocks agree. With `running` (every request the scheduler
        runs): exactly those hold tables; each table covers the request's computed tokens and
        `num_slots` says its size; its computed full blocks are the committed ones, each
        cached under the request's own hash of it (or not cached: when two requests compute
        the same block, the first one's copy is registered); and every block the request will
        still write (from its first uncomputed position on) is its alone and unregistered.
        """
        self.pool.check_integrity()
        holders = [0] * self.pool.num_blocks
        blocks = self.pool.blocks
        bs = self.block_size
        for request_id, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"request {request_id} holds a block twice")
            for block_id in table:
                holders[block_id] += 1
        parked_refs: dict[int, int] = {}
        for session_id, held in self._parked.items():
            if len(set(held)) != len(held):
                raise AssertionError(f"session {session_id} parks a block twice")
            for block_id in held:
                holders[block_id] += 1
                parked_refs[block_id] = parked_refs.get(block_id, 0) + 1
                if blocks[block_id].block_hash is None:
                    raise AssertionError(f"session {session_id} parks uncached block {block_id}")
        if parked_refs != self._parked_refs:
            raise AssertionError("the parked blocks' counts disagree with the parked sessions")
        for block in blocks:
            if block.ref_count != holders[block.block_id]:
                raise AssertionError(
                    f"block {block.block_id}: ref count {block.ref_count}, "
                    f"held by {holders[block.block_id]} tables and parked sessions"
                )
        if running is None:
            return
        running = list(running)
        ids = {r.request_id for r in running}
        if self._tables.keys() != ids:
            raise AssertionError(
                f"block tables held by requests that do not run: "
                f"{sorted(self._tables.keys() - ids)}; running without: "
                f"{sorted(ids - self._tables.keys())}"
            )
        for request in running:
            rid, computed = request.request_id, request.num_computed_tokens
            table = self._tables[rid]
            if len(table) * bs < computed or request.num_slots != len(table) * bs:
                raise AssertionError(
                    f"request {rid}: {computed} computed tokens, {len(table)} blocks, "
                    f"num_slots {request.num_slots}"
                )
            committed = request.num_committed_blocks
            if request.commit_at != self._commit_at(committed):
                raise AssertionError(
                    f"request {request.request_id}: commit_at {request.commit_at} with "
                    f"{committed} committed blocks"
                )
            if self.enable_prefix_caching and committed != min(computed // bs, len(table)):
                raise AssertionError(
                    f"request {rid}: {computed // bs} computed full blocks, {committed} "
                    "registered"
                )
            hashes = request.block_hashes
            if committed > len(hashes):
                raise AssertionError(f"request {rid}: committed blocks without hashes")
            for block_id, block_hash in zip(table[:committed], hashes, strict=False):
                if blocks[block_id].block_hash not in (None, block_hash):
                    raise AssertionError(
                        f"request {rid}: block {block_id} is cached under another hash"
                    )
            for block_id in table[computed // bs :]:
                block = blocks[block_id]
                if block.ref_count != 1 or block.block_hash is not None:
                    raise AssertionError(
                        f"request {rid} will write into block {block_id}, which is "
                        f"{'shared' if block.ref_count != 1 else 'registered'}"
                    )
