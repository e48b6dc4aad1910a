"""What a cost model sees of a step (`StepShape`) and what it answers (`CostModel.step_time`).

A step's cost depends only on its shape: how many tokens each request computes and how many
K/V entries its attention reads. Token ids, block ids and sampling parameters do not matter.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from heddle.core.outputs import SchedulerOutput


@dataclass(frozen=True, slots=True)
class StepShape:
    """The shape of one step.

    `prefill_chunks`: (num_new_tokens, context_len) for each request computing more than one
    token; `context_len` counts the cached prefix plus the new tokens, as
    `ScheduledRequest.context_len` does. `decode_context_lens`: `context_len` of each request
    computing exactly one token. `num_sampled`: rows that go through the LM head and sampler;
    None (replaced on construction) means one per decode request and none for the prefill
    chunks (chunks that stop short of the prompt's end).
    """

    prefill_chunks: tuple[tuple[int, int], ...] = ()
    decode_context_lens: tuple[int, ...] = ()
    num_sampled: int | None = None

    def __post_init__(self) -> None:
        for num_new_tokens, context_len in self.prefill_chunks:
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
        if any(c < 1 for c in self.decode_context_lens):
            raise ValueError(f"decode context lengths must be >= 1: {self.decode_context_lens}")
        num_sampled = self.num_sampled
        if num_sampled is None:
            num_sampled = len(self.decode_context_lens)
            object.__setattr__(self, "num_sampled", num_sampled)
        if not (0 <= num_sampled <= len(self.prefill_chunks) + len(self.decode_context_lens)):
            raise ValueError(
                f"num_sampled={self.num_sampled} is not between 0 and the number of requests"
            )

    @classmethod
    def from_scheduler_output(cls, scheduler_output: SchedulerOutput) -> StepShape:
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for scheduled in scheduler_output.scheduled:
            if scheduled.num_new_tokens > 1:
                prefill.append((scheduled.num_new_tokens, scheduled.context_len))
            elif scheduled.num_new_tokens == 1:
                decode.append(scheduled.context_len)
        num_sampled = sum(1 for s in scheduler_output.scheduled if s.sample)
        return cls(tuple(prefill), tuple(decode), num_sampled)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks)

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_context_lens)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_requests(self) -> int:
        return len(self.prefill_chunks) + len(self.decode_context_lens)

    @property
    def num_sampled_rows(self) -> int:
        """Rows through the LM head and sampler (`num_sampled`, typed as always set)."""
        assert self.num_sampled is not None  # set in __post_init__
        return self.num_sampled

    @property
    def decode_context_tokens(self) -> int:
        """K/V entries read by the decode requests' attention, summed."""
        return sum(self.decode_context_lens)

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

    @abc.abstractmethod
    def step_time(self, shape: StepShape) -> float:
        """Seconds the step takes; never negative."""

    def describe(self) -> str:
        """One line for logs and reports: what the model is and what it models."""
        return type(self).__name__
