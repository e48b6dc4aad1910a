"""The narrow contract between the scheduler and an executor: plain dataclasses of ids and lists.

The executor never reads or mutates a `Request`. It gets a `SchedulerOutput` and answers with an
`ExecutorOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heddle.request import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute `token_ids` at positions start_position.. ."""

    request_id: str
    token_ids: list[int]  # the tokens to compute this step (a prefill chunk, or one decode token)
    start_position: int  # == the request's num_computed_tokens before this step
    block_table: list[int]  # physical KV block ids covering positions 0..start+len(token_ids)-1
    sample: bool  # True when this step reaches the end of the known tokens: sample the next one
    sampling_params: SamplingParams
    num_prompt_tokens: int
    num_output_tokens: int  # output tokens the request had before this step
    # For simulated requests: the true output length (the executor emits EOS there).
    true_output_len: int | None = None
    eos_token_id: int | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens whose K/V the attention of this step reads (cached + new)."""
        return self.start_position + len(self.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes."""

    step_id: int
    scheduled: list[ScheduledRequest]
    # Requests that left the engine since the last step: the executor drops their state
    # (e.g. seeded random generators).
    finished_request_ids: list[str] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens computed without sampling, plus all but the last of sampling chunks."""
        return sum(
            len(s.token_ids) for s in self.scheduled if s.start_position < s.num_prompt_tokens
        )

    @property
    def num_decode_tokens(self) -> int:
        return sum(
            len(s.token_ids) for s in self.scheduled if s.start_position >= s.num_prompt_tokens
        )

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probability of the sampled token and the top-n alternatives at one position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


@dataclass(slots=True)
class ExecutorOutput:
    """The result of one step."""

    # request_id -> sampled token ids (one token, or none when the step did not sample).
    sampled_token_ids: dict[str, list[int]]
    step_duration: float  # seconds the step took (measured, or predicted by a cost model)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
