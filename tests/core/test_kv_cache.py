from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.core.kv_cache import KVCacheManager


def test_allocate_and_free_return_every_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("a", 9)  # 3 blocks
    assert kv.num_request_blocks("a") == 3
    assert kv.num_free_blocks == 5
    assert kv.allocate_slots("a", 12)  # still 3 blocks
    assert kv.num_request_blocks("a") == 3
    assert kv.allocate_slots("a", 13)
    assert kv.num_request_blocks("a") == 4
    kv.free("a")
    assert kv.num_free_blocks == 8
    kv.check_integrity()


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots("a", 8)
    assert not kv.allocate_slots("b", 12)
    assert not kv.has_blocks("b")
    assert kv.num_free_blocks == 2
    kv.check_integrity()


def test_prefix_cache_hit_shares_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(12))
    assert kv.allocate_slots("a", 12)
    kv.commit_computed("a", tokens, 12)
    blocks, hashes = kv.find_cached_prefix(tokens)
    # 12 tokens = 3 full blocks, but one token must be left to compute: 2 blocks hit.
    assert len(blocks) == 2
    assert kv.allocate_slots("b", 12, blocks, hashes)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    assert kv.block_ids("b")[2] != kv.block_ids("a")[2]
    assert kv.pool.blocks[kv.block_ids("a")[0]].ref_count == 2
    kv.check_integrity()


def test_freed_cached_blocks_are_found_until_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    tokens = list(range(9))
    assert kv.allocate_slots("a", 9)
    kv.commit_computed("a", tokens, 9)
    kv.free("a")
    blocks, _ = kv.find_cached_prefix(tokens)
    assert len(blocks) == 2
    # Taking all 4 blocks evicts the cached contents.
    assert kv.allocate_slots("b", 16)
    assert kv.find_cached_prefix(tokens) == ([], [])
    kv.check_integrity()


def test_lru_evicts_least_recently_freed_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    for name, first in (("a", 0), ("b", 100)):
        tokens = [first, first + 1, first + 2]
        assert kv.allocate_slots(name, 3)
        kv.commit_computed(name, tokens, 3)
    kv.free("a")
    kv.free("b")
    # Two new blocks are taken: a's (freed first, its partial tail before its cached head),
    # so b's cached prefix survives.
    assert kv.allocate_slots("c", 4)
    assert kv.find_cached_prefix([0, 1, 2]) == ([], [])
    assert len(kv.find_cached_prefix([100, 101, 102])[0]) == 1


def test_double_free_is_detected():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    kv.allocate_slots("a", 4)
    block = kv.pool.blocks[kv.block_ids("a")[0]]
    kv.free("a")
    with pytest.raises(RuntimeError, match="double free"):
        kv.pool.release([block])


def test_fork_shares_full_blocks_only():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("p", 10)
    computed = kv.fork("p", "c", 10)
    assert computed == 8
    assert kv.block_ids("c") == kv.block_ids("p")[:2]
    assert kv.allocate_slots("c", 11)
    assert kv.block_ids("c")[2] != kv.block_ids("p")[2]
    kv.free("p")
    kv.free("c")
    assert kv.num_free_blocks == 8
    kv.check_integrity()


# -- property test: random operation sequences never leak, double-free or share a live block --

_ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "append", "fork", "free", "evict", "commit"]),
        st.integers(0, 5),  # request index
        st.integers(1, 20),  # token count / amount
        st.integers(0, 2),  # prompt family (shared prefixes)
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_ops, st.integers(2, 12), st.integers(1, 4))
def test_random_operations_keep_the_pool_whole(ops, num_blocks, block_size):
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size)
    tokens: dict[str, list[int]] = {}
    lengths: dict[str, int] = {}
    for op, index, amount, family in ops:
        rid = f"r{index}"
        if op == "alloc" and rid not in tokens:
            seq = [family * 1000 + i for i in range(amount)]
            blocks, hashes = kv.find_cached_prefix(seq)
            if kv.allocate_slots(rid, amount, blocks, hashes):
                tokens[rid], lengths[rid] = seq, amount
        elif op == "append" and rid in tokens:
            new_len = lengths[rid] + amount
            if kv.allocate_slots(rid, new_len):
                tokens[rid] = tokens[rid] + [7] * amount
                lengths[rid] = new_len
        elif op == "commit" and rid in tokens:
            kv.commit_computed(rid, tokens[rid], lengths[rid])
        elif op == "fork" and rid in tokens:
            child = f"{rid}f{amount}"
            if child not in tokens:
                computed = kv.fork(rid, child, lengths[rid])
                tokens[child] = list(tokens[rid][:computed])
                lengths[child] = computed
        elif op == "free" and rid in tokens:
            kv.free(rid)
            del tokens[rid], lengths[rid]
        elif op == "evict":
            kv.evict_cached(amount)
        kv.check_integrity()
        # No block is handed to two requests unless both hold a reference (sharing is counted).
        live = [b for rid_ in tokens for b in kv.block_ids(rid_)]
        for block_id in set(live):
            assert kv.pool.blocks[block_id].ref_count == live.count(block_id)
        assert kv.num_used_blocks == len(set(live))
    for rid in list(tokens):
        kv.free(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == num_blocks
