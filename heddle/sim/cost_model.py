"""What a cost model sees of a step (`StepShape`) and what it answers (`CostModel.step_time`).

A step's cost depends only on its shape: how many tokens each request computes and how many
K/V entries its attention reads. Token ids, block ids and sampling parameters do not matter.
"""

from __future__ import annotations

import abc

from heddle.core.outputs import SchedulerOutput


class StepShape:
    """The shape of one step.

    `prefill_chunks`: (num_new_tokens, context_len) for each request computing more than one
    token; `context_len` counts the cached prefix plus the new tokens, as a row's
    `num_computed_tokens + num_new_tokens` does. Requests computing exactly one token are
    counted (`num_decode_tokens`) with their context lengths summed
    (`decode_context_tokens`): that is all a cost model reads of them. `num_sampled`: rows
    that go through the LM head and sampler (a speculative verify row, k drafts after its known
    token, has k + 1: it is verified at each); None (replaced on construction) means one per
    decode request and none for the prefill chunks (chunks that stop short of the prompt's end).
    `num_constrained`: of the sampled rows, those under a grammar (structured outputs); each
    costs its token-mask work on the host (fill, apply, advance), which the cost models charge
    per row. 0 leaves every prediction as it was.
    `decode_block_breaks`: the breaks in the decode rows' block tables, summed (blocks that do
    not follow the one before them in the pool, heddle.sim.block_layout): what a table spread
    over the pool costs the decode attention. 0 (a fresh pool's runs of blocks, or unknown)
    leaves every prediction as it was.

    Build one from per-request contexts, `StepShape(chunks, (ctx, ctx, ...), num_sampled)`, or
    from a step's totals, `StepShape.from_scheduler_output(so)` (no loop over its rows).
    """

    __slots__ = (
        "_decode_context_lens",
        "decode_block_breaks",
        "decode_context_tokens",
        "num_constrained",
        "num_decode_tokens",
        "num_sampled",
        "prefill_chunks",
    )

    def __init__(
        self,
        prefill_chunks: tuple[tuple[int, int], ...] = (),
        decode_context_lens: tuple[int, ...] = (),
        num_sampled: int | None = None,
        num_constrained: int = 0,
        decode_block_breaks: int = 0,
    ) -> None:
        if any(c < 1 for c in decode_context_lens):
            raise ValueError(f"decode context lengths must be >= 1: {decode_context_lens}")
        self._init(
            tuple(prefill_chunks),
            len(decode_context_lens),
            sum(decode_context_lens),
            num_sampled,
            num_constrained,
            decode_block_breaks,
        )
        self._decode_context_lens: tuple[int, ...] | None = tuple(decode_context_lens)

    @classmethod
    def from_totals(
        cls,
        prefill_chunks: tuple[tuple[int, int], ...],
        num_decode_tokens: int,
        decode_context_tokens: int,
        num_sampled: int | None = None,
        num_constrained: int = 0,
        decode_block_breaks: int = 0,
    ) -> StepShape:
        if decode_context_tokens < num_decode_tokens:
            raise ValueError("each decode request reads at least one K/V entry")
        shape = cls.__new__(cls)
        shape._init(prefill_chunks, num_decode_tokens, decode_context_tokens, num_sampled,
                    num_constrained, decode_block_breaks)  # fmt: skip
        shape._decode_context_lens = None
        return shape

    def _init(
        self,
        prefill_chunks: tuple[tuple[int, int], ...],
        num_decode_tokens: int,
        decode_context_tokens: int,
        num_sampled: int | None,
        num_constrained: int = 0,
        decode_block_breaks: int = 0,
    ) -> None:
        for num_new_tokens, context_len in prefill_chunks:
            if num_new_tokens < 2:
                raise ValueError(
                    f"a prefill chunk computes at least 2 tokens, got {num_new_tokens}: "
                    "one-token steps belong in decode_context_lens"
                )
            if context_len < num_new_tokens:
                raise ValueError(
                    f"context_len {context_len} is shorter than the chunk's {num_new_tokens} "
                    "new tokens (context_len counts them)"
                )
        if num_sampled is None:
            num_sampled = num_decode_tokens
        num_tokens = sum(n for n, _ in prefill_chunks) + num_decode_tokens
        if not 0 <= num_sampled <= num_tokens:  # a verify row has a logit row per token
            raise ValueError(f"num_sampled={num_sampled} is not between 0 and the number of "
                             f"tokens ({num_tokens})")
        if not 0 <= num_constrained <= num_sampled:
            raise ValueError(
                f"num_constrained={num_constrained} is not between 0 and num_sampled={num_sampled}"
            )
        self.prefill_chunks = prefill_chunks
        self.num_decode_tokens = num_decode_tokens
        self.decode_context_tokens = decode_context_tokens
        if decode_block_breaks < 0 or (decode_block_breaks and not num_decode_tokens):
            raise ValueError(f"decode_block_breaks={decode_block_breaks}: breaks are counted in "
                             "the decode rows' tables, never below 0")  # fmt: skip
        self.num_sampled = num_sampled
        self.num_constrained = num_constrained
        self.decode_block_breaks = decode_block_breaks

    @classmethod
    def from_scheduler_output(
        cls, scheduler_output: SchedulerOutput, decode_block_breaks: int = 0
    ) -> StepShape:
        """`decode_block_breaks`: the step's breaks, from a `BlockBreaks` that follows the
        executor's tables (a SchedulerOutput sends a known request's new blocks only)."""
        so = scheduler_output
        return cls.from_totals(
            tuple(so.prefill_chunks),
            so.num_decode_rows,
            so.decode_context_tokens,
            so.num_sampled,
            so.num_constrained,
            decode_block_breaks,
        )

    def with_breaks(self, decode_block_breaks: int) -> StepShape:
        """The same step with its decode rows' tables broken `decode_block_breaks` times."""
        return StepShape.from_totals(self.prefill_chunks, self.num_decode_tokens,
                                     self.decode_context_tokens, self.num_sampled,
                                     self.num_constrained, decode_block_breaks)  # fmt: skip

    @property
    def decode_context_lens(self) -> tuple[int, ...]:
        """Each decode request's context length; for a shape built from totals, the same total
        spread evenly (a cost model only reads the count and the sum)."""
        if self._decode_context_lens is not None:
            return self._decode_context_lens
        n, total = self.num_decode_tokens, self.decode_context_tokens
        if n == 0:
            return ()
        q, r = divmod(total, n)
        return (q + 1,) * r + (q,) * (n - r)

    def _key(self) -> tuple[object, ...]:
        return (
            self.prefill_chunks,
            self.num_decode_tokens,
            self.decode_context_tokens,
            self.num_sampled,
            self.num_constrained,
            self.decode_block_breaks,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepShape):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"StepShape(prefill_chunks={self.prefill_chunks}, num_decode_tokens="
            f"{self.num_decode_tokens}, decode_context_tokens={self.decode_context_tokens}, "
            f"num_sampled={self.num_sampled}"
            + (f", num_constrained={self.num_constrained}" if self.num_constrained else "")
            + (f", decode_block_breaks={self.decode_block_breaks})"
               if self.decode_block_breaks else ")")
        )

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_requests(self) -> int:
        return len(self.prefill_chunks) + self.num_decode_tokens

    @property
    def num_sampled_rows(self) -> int:
        """Rows through the LM head and sampler."""
        return self.num_sampled

    @property
    def prefill_attention_pairs(self) -> int:
        """(query, key) pairs of the prefill chunks' causal attention, summed.

        A chunk of n new tokens after a cached prefix of p = context_len - n tokens: query i
        (0-based) sees p + i + 1 keys, n*p + n*(n+1)/2 pairs in all.
        """
        return sum(n * (c - n) + n * (n + 1) // 2 for n, c in self.prefill_chunks)

    @property
    def is_empty(self) -> bool:
        return self.num_requests == 0


class CostModel(abc.ABC):
    """Predicts how long a step of a given shape takes on some model and machine."""

    # Whether step_time reads `StepShape.decode_block_breaks` (the simulator then follows the
    # block tables to count them; heddle.sim.block_layout).
    reads_block_breaks = False

    @abc.abstractmethod
    def step_time(self, shape: StepShape) -> float:
        """Seconds the step takes; never negative."""

    def idle_time(self, gap: float | None) -> float:
        """Extra seconds of a step that follows `gap` seconds with nothing running (None: the
        first step); 0 unless the model measured an idle warm-up (heddle.sim.warmup)."""
        return 0.0

    @property
    def charges_idle(self) -> bool:
        """Whether `idle_time` can be non-zero (the simulated executor skips it otherwise)."""
        return False

    def describe(self) -> str:
        """One line for logs and reports: what the model is and what it models."""
        return type(self).__name__
