"""The narrow contract between the scheduler and an executor: plain dataclasses of ids and lists.

The executor never reads or mutates a `Request`. Each step it gets a `SchedulerOutput` and
answers with an `ExecutorOutput`. The output is column-wise and costs the step what changed:

- a request the executor has not seen (first scheduled, or resumed after a preemption) comes
  once as a `NewRequest`: its known token ids, block table and sampling parameters;
- every request in the step is a row of the parallel columns `request_ids`,
  `num_computed_tokens` (its position: tokens that already have KV), `num_new_tokens` (tokens
  to compute now) and `sample` (the step reaches the end of its known tokens: sample one);
- a request seen before sends only the blocks appended to its table since its last step
  (`new_block_ids`); tables only grow while a request runs;
- totals (prefill and decode tokens, context lengths, ...) are computed once, when the output
  is built, so a cost model needs no loop over rows.

The executor keeps its own state per request id (token ids, block table, sampling state): it
appends the tokens it samples, extends tables with `new_block_ids`, and drops the state of the
ids in `finished_request_ids` and `preempted_request_ids` (a preempted request that resumes
comes again as a `NewRequest`).

Extension points, designed in (see docs/ARCHITECTURE.md):
- speculative decoding: `draft_token_ids[rid]` are proposed tokens beyond the known ones;
  `num_new_tokens` counts them; the executor returns the accepted drafts plus one sampled
  token (1..k+1 tokens). The scheduler sets the request's computed count to what was accepted
  (the next row's `num_computed_tokens` says so); blocks stay with the request, and only
  accepted, computed full blocks are ever registered in the prefix cache;
- structured outputs: `token_masks`, when set, gives the allowed tokens of each sampling row;
  the executor asks for them (`wait()`) just before sampling, so they may be computed while
  the forward pass runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from heddle.request import SamplingParams

if TYPE_CHECKING:
    from heddle.sessions.draft_kv import DraftOrder


@dataclass(slots=True)
class NewRequest:
    """Everything about a request the executor has not seen, sent once."""

    request_id: str
    token_ids: list[int]  # every known token: the prompt, then the outputs so far (a copy)
    num_prompt_tokens: int
    block_ids: list[int]  # its block table (a copy the executor may keep and extend)
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    # For simulated requests: the true output length (the executor emits EOS there).
    true_output_len: int | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class TokenMasks(Protocol):
    """Allowed tokens per sampling row (structured outputs), possibly still being computed."""

    def wait(self) -> Mapping[str, Sequence[int]]:
        """request id -> bitmask as 32-bit words (bit t of word t // 32 allows token t).

        Rows without an entry are unconstrained. Called once per step, before sampling."""
        ...


class Row(NamedTuple):
    """One request's share of a step, for readers that want rows (tests, logs)."""

    request_id: str
    num_computed_tokens: int
    num_new_tokens: int
    sample: bool

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes. The row columns are parallel lists, in the scheduler's order."""

    step_id: int
    request_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)  # the row's start position
    num_new_tokens: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)
    new_requests: list[NewRequest] = field(default_factory=list)
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    token_masks: TokenMasks | None = None
    # The second KV tier (heddle/sessions/tier.py): copies the executor makes before the
    # forward pass, out-copies first: (pool block id, tier slot) and (tier slot, pool block id).
    offload_blocks: list[tuple[int, int]] = field(default_factory=list)
    restore_blocks: list[tuple[int, int]] = field(default_factory=list)
    # What happened to agent sessions since the last step, for a draft model's KV
    # (heddle/sessions/draft_kv.py); empty unless the executor runs a draft model.
    draft_session_orders: list[DraftOrder] = field(default_factory=list)
    # Requests that left the engine since the last step (the executor drops their state).
    finished_request_ids: list[str] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    # Totals, computed once while the output is built.
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0  # tokens of rows that start inside their prompt
    num_decode_tokens: int = 0  # tokens of rows that start past their prompt
    num_sampled: int = 0  # logit rows: one per row that samples, k + 1 for k drafts
    # (new tokens, context length) of each row computing more than one token.
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    num_decode_rows: int = 0  # rows computing exactly one token
    decode_context_tokens: int = 0  # their context lengths (cached + new), summed
    longest_context: int = 0  # the largest context length of any row
    # Sampling rows under a grammar (structured outputs): set by the engine, which owns the
    # grammars; a cost model charges each its token-mask work (StepShape.num_constrained).
    num_constrained: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)

    @property
    def is_empty(self) -> bool:
        return not self.request_ids

    def rows(self) -> list[Row]:
        return [
            Row(*columns)
            for columns in zip(
                self.request_ids,
                self.num_computed_tokens,
                self.num_new_tokens,
                self.sample,
                strict=True,
            )
        ]

    def scheduled_tokens(self) -> dict[str, int]:
        """request id -> tokens it computes this step."""
        return dict(zip(self.request_ids, self.num_new_tokens, strict=True))


class OutputBuilder:
    """Builds a valid SchedulerOutput row by row, totals included: for drivers other than the
    scheduler (profiling, tests), which hand-inlines the same bookkeeping on its hot path."""

    def __init__(self, step_id: int) -> None:
        self.output = SchedulerOutput(step_id=step_id)

    def add(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_new_tokens: int,
        sample: bool,
        *,
        num_prompt_tokens: int,
        new_request: NewRequest | None = None,
        new_block_ids: list[int] | None = None,
    ) -> None:
        """One row. A request the executor has not seen needs its `new_request`."""
        so = self.output
        end = num_computed_tokens + num_new_tokens
        so.request_ids.append(request_id)
        so.num_computed_tokens.append(num_computed_tokens)
        so.num_new_tokens.append(num_new_tokens)
        so.sample.append(sample)
        if new_request is not None:
            so.new_requests.append(new_request)
        if new_block_ids:
            so.new_block_ids[request_id] = list(new_block_ids)
        so.num_scheduled_tokens += num_new_tokens
        if num_computed_tokens < num_prompt_tokens:
            so.num_prefill_tokens += num_new_tokens
        else:
            so.num_decode_tokens += num_new_tokens
        so.num_sampled += sample
        if num_new_tokens == 1:
            so.num_decode_rows += 1
            so.decode_context_tokens += end
        else:
            so.prefill_chunks.append((num_new_tokens, end))
        so.longest_context = max(so.longest_context, end)

    def build(
        self,
        finished_request_ids: Sequence[str] = (),
        preempted_request_ids: Sequence[str] = (),
    ) -> SchedulerOutput:
        self.output.finished_request_ids = list(finished_request_ids)
        self.output.preempted_request_ids = list(preempted_request_ids)
        return self.output


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probability of the sampled token and the top-n alternatives at one position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


@dataclass(slots=True)
class ExecutorOutput:
    """The result of one step."""

    # Parallel to SchedulerOutput.request_ids: the tokens each row sampled (one, or with
    # draft tokens up to k+1, or none when the row did not sample).
    sampled_token_ids: list[Sequence[int]]
    step_duration: float  # seconds the step took (measured, or predicted by a cost model)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
