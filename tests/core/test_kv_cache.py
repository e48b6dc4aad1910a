from __future__ import annotations

import hashlib
import struct

import pytest

from heddle.config import CacheConfig
from heddle.core import block_hash
from heddle.core.kv_cache import KVCacheManager
from heddle.errors import HeddleError
from tests.core import kv_ops


def test_allocate_and_free_return_every_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv_ops.allocate(kv, "a", 9)  # 3 blocks
    assert kv_ops.num_blocks(kv, "a") == 3
    assert kv.num_free_blocks == 5
    assert kv_ops.allocate(kv, "a", 12)  # still 3 blocks
    assert kv_ops.num_blocks(kv, "a") == 3
    assert kv_ops.allocate(kv, "a", 13)
    assert kv_ops.num_blocks(kv, "a") == 4
    kv_ops.free(kv, "a")
    assert kv.num_free_blocks == 8
    kv.check_integrity()


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv_ops.allocate(kv, "a", 8)
    assert not kv_ops.allocate(kv, "b", 12)
    assert kv_ops.num_blocks(kv, "b") == 0
    assert kv.num_free_blocks == 2
    kv.check_integrity()


def test_prefix_cache_hit_shares_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(12))
    assert kv_ops.allocate(kv, "a", 12, tokens=tokens)
    kv_ops.commit(kv, "a", tokens, 12)
    hits = kv_ops.lookup(kv, "b", tokens)
    # 12 tokens = 3 full blocks, but one token must be left to compute: 2 blocks hit.
    assert len(hits) == 2
    assert kv_ops.allocate(kv, "b", 12, hits, tokens=tokens)
    assert kv_ops.table(kv, "b")[:2] == kv_ops.table(kv, "a")[:2]
    assert kv_ops.table(kv, "b")[2] != kv_ops.table(kv, "a")[2]
    assert kv.pool.blocks[kv_ops.table(kv, "a")[0]].ref_count == 2
    kv.check_integrity()


def test_freed_cached_blocks_are_found_until_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    tokens = list(range(9))
    assert kv_ops.allocate(kv, "a", 9, tokens=tokens)
    kv_ops.commit(kv, "a", tokens, 9)
    kv_ops.free(kv, "a")
    assert len(kv_ops.lookup(kv, "x", tokens)) == 2
    # Taking all 4 blocks evicts the cached contents.
    assert kv_ops.allocate(kv, "b", 16)
    assert kv_ops.lookup(kv, "y", tokens) == []
    kv.check_integrity()


def test_lru_evicts_least_recently_freed_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    for name, first in (("a", 0), ("b", 100)):
        tokens = [first, first + 1, first + 2]
        assert kv_ops.allocate(kv, name, 3, tokens=tokens)
        kv_ops.commit(kv, name, tokens, 3)
    kv_ops.free(kv, "a")
    kv_ops.free(kv, "b")
    # Two new blocks are taken: a's (freed first, its partial tail before its cached head),
    # so b's cached prefix survives.
    assert kv_ops.allocate(kv, "c", 4)
    assert kv_ops.lookup(kv, "x", [0, 1, 2]) == []
    assert len(kv_ops.lookup(kv, "y", [100, 101, 102])) == 1


def test_double_free_is_detected():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    kv_ops.allocate(kv, "a", 4)
    block = kv.pool.blocks[kv_ops.table(kv, "a")[0]]
    kv_ops.free(kv, "a")
    with pytest.raises(RuntimeError, match="double free"):
        kv.pool.release([block])


def test_a_lookup_stops_at_the_first_miss():
    """A cached block after a missing one is never a hit: its KV belongs to a prefix whose
    start is no longer cached. (Such a hole arises in ordinary use: K caches block 0 of a
    prefix while L, admitted before K finished it, computes its own copy of block 0 and then
    block 1; K's block 0 is evicted, L's block 1 stays cached.)"""
    kv = KVCacheManager(num_blocks=4, block_size=2)
    k, l_tokens = [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]
    assert kv_ops.allocate(kv, "K", 1, tokens=k)
    kv_ops.commit(kv, "K", k, 1)
    assert kv_ops.lookup(kv, "L", l_tokens) == []
    assert kv_ops.allocate(kv, "L", 1, tokens=l_tokens)
    kv_ops.commit(kv, "L", l_tokens, 1)
    assert kv_ops.allocate(kv, "K", 2)
    kv_ops.commit(kv, "K", k, 2)  # K's block 0 is cached
    assert kv_ops.allocate(kv, "L", 4)
    kv_ops.commit(kv, "L", l_tokens, 4)  # L's block 1 is cached after L's own copy of block 0
    kv_ops.free(kv, "K")
    assert kv_ops.allocate(kv, "M", 4)  # takes both free blocks: K's block 0 is evicted
    assert kv.pool.blocks[kv_ops.table(kv, "L")[1]].block_hash is not None  # the hole
    assert kv_ops.lookup(kv, "N", [1, 2, 3, 4, 9]) == []
    kv.check_integrity()


# -- the hash: SHA-256 of a fixed encoding, chained, salted ------------------------------------


def test_block_hash_is_sha256_of_the_parent_and_the_token_ids():
    """Pins the hash function: a silent downgrade (to `hash()`, a shorter digest or another
    encoding) fails here."""
    assert block_hash.BLOCK_HASH_ALGORITHM == "sha256"
    root = block_hash.root_hash("model-x", None)
    assert root == hashlib.sha256(b"heddle-kv-v1\0model-x\x000").digest()
    assert block_hash.root_hash("model-x", "tenant") == hashlib.sha256(
        b"heddle-kv-v1\0model-x\x001tenant"
    ).digest()
    tokens = [5, 70000, 3, 1 << 40]
    expected = hashlib.sha256(root + struct.pack("<4q", *tokens)).digest()
    assert block_hash.hash_block_tokens(root, tokens) == expected
    assert len(expected) == 32
    assert block_hash.block_hashes(tokens * 2 + [9], 4, "model-x") == [
        expected,
        hashlib.sha256(expected + struct.pack("<4q", *tokens)).digest(),
    ]


def test_the_cache_keys_blocks_by_the_chained_sha256():
    kv = KVCacheManager(num_blocks=8, block_size=4, namespace="m")
    tokens = list(range(10, 19))
    assert kv_ops.allocate(kv, "a", 9, tokens=tokens)
    kv_ops.commit(kv, "a", tokens, 9)
    expected = block_hash.block_hashes(tokens, 4, "m")
    table = kv_ops.table(kv, "a")
    assert [kv.pool.blocks[b].block_hash for b in table[:2]] == expected
    assert kv.pool.blocks[table[2]].block_hash is None  # the partial block is not registered


def test_equal_blocks_after_different_prefixes_do_not_hit():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = [1, 2, 3, 4, 5]
    assert kv_ops.allocate(kv, "a", 5, tokens=a)
    kv_ops.commit(kv, "a", a, 5)
    # The second block [3, 4] is cached, but after [1, 2], not after [9, 9].
    assert kv_ops.lookup(kv, "b", [9, 9, 3, 4, 5]) == []
    assert len(kv_ops.lookup(kv, "c", [1, 2, 3, 4, 5])) == 2


def test_salts_and_namespaces_separate_cache_entries():
    tokens = list(range(20, 29))
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv_ops.allocate(kv, "a", 9, tokens=tokens, salt="tenant-1")
    kv_ops.commit(kv, "a", tokens, 9)
    assert kv_ops.lookup(kv, "b", tokens, salt="tenant-2") == []
    assert kv_ops.lookup(kv, "c", tokens) == []
    assert len(kv_ops.lookup(kv, "d", tokens, salt="tenant-1")) == 2
    assert block_hash.block_hashes(tokens, 4, "model-a") != block_hash.block_hashes(
        tokens, 4, "model-b"
    )


@pytest.mark.parametrize("algorithm", ["sha256", "builtin"])
def test_both_block_hashes_separate_prefixes_salts_and_namespaces(algorithm: str) -> None:
    """The simulator's builtin hash keys blocks by the same chain (parent, tokens), salted."""
    kv = KVCacheManager(num_blocks=16, block_size=2, namespace="m", block_hash=algorithm)
    a = [1, 2, 3, 4, 5]
    assert kv_ops.allocate(kv, "a", 5, tokens=a, salt="t1")
    kv_ops.commit(kv, "a", a, 5)
    assert kv_ops.lookup(kv, "b", [9, 9, 3, 4, 5], salt="t1") == []  # [3, 4] after another
    assert kv_ops.lookup(kv, "c", a, salt="t2") == []
    assert kv_ops.lookup(kv, "d", a) == []
    assert len(kv_ops.lookup(kv, "e", a, salt="t1")) == 2
    hashes = [kv.pool.blocks[b].block_hash for b in kv_ops.table(kv, "a")[:2]]
    assert all(isinstance(h, bytes if algorithm == "sha256" else int) for h in hashes)


def test_the_builtin_block_hash_is_the_tuple_hash_of_the_chain() -> None:
    root = block_hash.root_hash("m", None, "builtin")
    assert root == int.from_bytes(block_hash.root_hash("m", None)[:8], "little", signed=True)
    assert block_hash.builtin_hash_block_tokens(root, [3, 4]) == hash((root, 3, 4))
    with pytest.raises(ValueError, match="block hash must be one of"):
        block_hash.block_hasher("md5")
    with pytest.raises(ValueError, match="block hash must be one of"):
        block_hash.root_hash("m", None, "md5")
    with pytest.raises(HeddleError, match="block_hash must be sha256 or builtin"):
        CacheConfig(block_hash="md5")  # type: ignore[arg-type]


# -- integrity: the checks catch what they promise ----------------------------------------


def test_integrity_catches_a_write_into_a_registered_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    tokens = list(range(8))
    assert kv_ops.allocate(kv, "a", 8, tokens=tokens)
    kv_ops.commit(kv, "a", tokens, 8)
    kv.check_integrity(kv_ops.computed(kv, {"a": 8}))
    # Claiming fewer computed tokens than the registered blocks hold: the request would write
    # into its registered second block.
    with pytest.raises(AssertionError, match=r"registered|computed full blocks"):
        kv.check_integrity(kv_ops.computed(kv, {"a": 5}))


def test_integrity_catches_a_table_held_by_a_request_that_does_not_run():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv_ops.allocate(kv, "a", 4)
    assert kv_ops.allocate(kv, "b", 4)
    with pytest.raises(AssertionError, match="do not run"):
        kv.check_integrity(kv_ops.computed(kv, {"a": 0}))


def test_integrity_catches_a_shared_block_that_will_be_written():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    tokens = list(range(9))
    assert kv_ops.allocate(kv, "a", 9, tokens=tokens)
    kv_ops.commit(kv, "a", tokens, 9)
    hits = kv_ops.lookup(kv, "b", tokens)
    assert kv_ops.allocate(kv, "b", 9, hits, tokens=tokens)
    kv.check_integrity(kv_ops.computed(kv, {"a": 9, "b": 8}))
    with pytest.raises(AssertionError):  # b claims its shared blocks are not computed yet
        kv.check_integrity(kv_ops.computed(kv, {"a": 9, "b": 4}))


def test_root_hashes_kept_per_salt_stay_bounded() -> None:
    """Cache salts come from clients: the root hashes kept per salt never pass the bound, and a
    salt's root hash is the same whether it was kept or computed again."""
    from heddle.core import kv_cache as module
    from heddle.request import Request, SamplingParams

    manager = module.KVCacheManager(num_blocks=8, block_size=4)
    roots = {}
    for i in range(module._ROOT_HASHES_KEPT + 10):
        salt = f"tenant-{i % (module._ROOT_HASHES_KEPT + 5)}"
        request = Request(f"r{i}", list(range(8)), SamplingParams(), 0.0, cache_salt=salt)
        manager._block_hash(request, 0)
        assert request.root_hash is not None
        assert roots.setdefault(salt, request.root_hash) == request.root_hash
        assert len(manager._root_hashes) <= module._ROOT_HASHES_KEPT
