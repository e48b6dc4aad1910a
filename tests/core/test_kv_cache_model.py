"""The KV cache manager against a shadow model: random admissions, chunks, samples and frees.

The shadow keeps what the manager must get right, in the plainest terms: the tokens each live
request has and how many are computed, the KV content of each block (the whole token prefix
its KV was computed with), and the prefix cache as "token prefix -> block" (first writer
wins; an entry is gone once its block is handed out again). After every rule:
- a lookup returns exactly the shadow's longest cached prefix, contiguous from the start,
  each block holding KV for exactly the queried prefix;
- an allocation succeeds exactly when the blocks it needs fit in the free pool, less the
  free cached blocks it would take out of it;
- `check_integrity` holds with every live request's computed count.
Small pools and block sizes, and a two-token alphabet, so that collisions of block contents,
evictions and tight allocations all happen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from heddle.core.kv_cache import KVCacheManager
from tests.core import kv_ops

# Prompts are cut from a few stems, so that prefixes (and equal blocks after different
# prefixes) repeat.
STEMS = ([0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1], [0, 1, 0, 0, 1, 1, 0, 1, 0, 0], [1, 1, 0, 1, 0, 1])


@dataclass
class Shadow:
    tokens: list[int]
    computed: int
    table: list[int] = field(default_factory=list)


class KVCacheModel(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(2, 9), block_size=st.integers(1, 3))
    def setup(self, num_blocks: int, block_size: int) -> None:
        self.kv = KVCacheManager(num_blocks, block_size)
        self.bs = block_size
        self.num_blocks = num_blocks
        self.live: dict[str, Shadow] = {}
        self.content: dict[int, tuple[int, ...]] = {}  # block -> prefix its KV holds
        self.cached: dict[tuple[int, ...], int] = {}  # prefix -> registered block
        self.next_id = 0

    # -- the shadow's own answers --------------------------------------------------------
    def held(self) -> dict[int, int]:
        holders: dict[int, int] = {}
        for shadow in self.live.values():
            for block_id in shadow.table:
                holders[block_id] = holders.get(block_id, 0) + 1
        return holders

    def expected_hits(self, tokens: list[int]) -> list[int]:
        hits = []
        for i in range((len(tokens) - 1) // self.bs):
            block_id = self.cached.get(tuple(tokens[: (i + 1) * self.bs]))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def expect_fit(self, need: int, taking_free: int = 0) -> bool:
        free = self.num_blocks - len(self.held())
        return need <= 0 or need <= free - taking_free

    def take_new_blocks(self, rid: str, shadow: Shadow) -> None:
        """Blocks the manager just handed out lose whatever they held."""
        table = kv_ops.table(self.kv, rid)
        assert table[: len(shadow.table)] == shadow.table  # tables only grow while live
        for block_id in table[len(shadow.table) :]:
            self.content.pop(block_id, None)
            for prefix in [p for p, b in self.cached.items() if b == block_id]:
                del self.cached[prefix]
        shadow.table = table

    def compute(self, rid: str, shadow: Shadow, num_new: int) -> None:
        """The step computes `num_new` tokens: full blocks get their content and are cached."""
        start, end = shadow.computed, shadow.computed + num_new
        for i in range(start // self.bs, end // self.bs):
            prefix = tuple(shadow.tokens[: (i + 1) * self.bs])
            block_id = shadow.table[i]
            self.content[block_id] = prefix
            self.cached.setdefault(prefix, block_id)
        shadow.computed = end
        kv_ops.commit(self.kv, rid, shadow.tokens, end)

    def pick(self, index: int) -> tuple[str, Shadow]:
        rid = sorted(self.live)[index % len(self.live)]
        return rid, self.live[rid]

    # -- rules ---------------------------------------------------------------------------
    @rule(
        stem=st.integers(0, len(STEMS) - 1),
        length=st.integers(1, 12),
        tail=st.lists(st.integers(0, 1), max_size=3),
        chunk=st.integers(1, 12),
    )
    def admit(self, stem: int, length: int, tail: list[int], chunk: int) -> None:
        tokens = STEMS[stem][:length] + tail
        rid = f"r{self.next_id}"
        self.next_id += 1
        hits = kv_ops.lookup(self.kv, rid, tokens)
        assert [b.block_id for b in hits] == self.expected_hits(tokens)
        for i, block in enumerate(hits):
            assert self.content[block.block_id] == tuple(tokens[: (i + 1) * self.bs])
        num_cached = len(hits) * self.bs
        assert num_cached < len(tokens)  # one token is always left to compute
        num_new = min(chunk, len(tokens) - num_cached)
        need = self.kv.blocks_needed(num_cached + num_new) - len(hits)
        held = self.held()
        reclaimed = sum(1 for b in hits if b.block_id not in held)
        expected = self.expect_fit(need, reclaimed)
        ok = kv_ops.allocate(self.kv, rid, num_cached + num_new, hits, tokens=tokens)
        assert ok == expected, (need, reclaimed)
        if not ok:
            assert kv_ops.num_blocks(self.kv, rid) == 0
            return
        shadow = Shadow(list(tokens), num_cached, [b.block_id for b in hits])
        self.live[rid] = shadow
        self.take_new_blocks(rid, shadow)
        self.compute(rid, shadow, num_new)

    @precondition(lambda self: any(s.computed < len(s.tokens) for s in self.live.values()))
    @rule(index=st.integers(0, 7), chunk=st.integers(1, 8))
    def next_chunk(self, index: int, chunk: int) -> None:
        pending = sorted(r for r, s in self.live.items() if s.computed < len(s.tokens))
        rid = pending[index % len(pending)]
        shadow = self.live[rid]
        num_new = min(chunk, len(shadow.tokens) - shadow.computed)
        need = self.kv.blocks_needed(shadow.computed + num_new) - len(shadow.table)
        expected = self.expect_fit(need)
        assert kv_ops.allocate(self.kv, rid, shadow.computed + num_new) == expected
        if expected:
            self.take_new_blocks(rid, shadow)
            self.compute(rid, shadow, num_new)

    @precondition(lambda self: any(s.computed == len(s.tokens) for s in self.live.values()))
    @rule(index=st.integers(0, 7), token=st.integers(0, 1))
    def sample(self, index: int, token: int) -> None:
        done = sorted(r for r, s in self.live.items() if s.computed == len(s.tokens))
        self.live[done[index % len(done)]].tokens.append(token)

    @precondition(lambda self: bool(self.live))
    @rule(index=st.integers(0, 7))
    def free(self, index: int) -> None:
        rid, _ = self.pick(index)
        kv_ops.free(self.kv, rid)
        del self.live[rid]

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def pool_matches_the_shadow(self) -> None:
        if not hasattr(self, "kv"):
            return
        self.kv.check_integrity(
            kv_ops.computed(self.kv, {r: s.computed for r, s in self.live.items()})
        )
        held = self.held()
        assert self.kv.num_free_blocks == self.num_blocks - len(held)
        for block_id, count in held.items():
            assert self.kv.pool.blocks[block_id].ref_count == count
        for rid, shadow in self.live.items():
            assert kv_ops.table(self.kv, rid) == shadow.table


KVCacheModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None, derandomize=True
)
TestKVCacheModel = KVCacheModel.TestCase
