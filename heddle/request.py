"""A request: its token ids, how many are computed, its sampling parameters and its record.

There is no prefill or decode phase. A request has `all_token_ids` (prompt + output so far)
and `num_computed_tokens` (how many of them have K/V in the cache). Each step the scheduler
gives a request some number of tokens to compute; when the computed tokens reach the end of
`all_token_ids`, the step also samples the next token.

What the scheduler and the policies decide from lives here (counts, the first token's time,
preemptions); what reports need lives in the `RequestRecord` (every token's time, stall
time, ...), which the scheduler writes at state changes and nobody decides from.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

from heddle.core.block_hash import BlockHash
from heddle.errors import InvalidRequestError
from heddle.metrics.record import RequestRecord
from heddle.reasoning.phase import ReasoningState
from heddle.sessions.session import SessionInfo
from heddle.structured.spec import GrammarSpec


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens and when to stop. Shaped like vLLM's SamplingParams."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None
    # Draws of the seeded generator already used: a request resumed on another replica after k
    # tokens continues the same random stream (heddle.cluster sets it).
    seed_offset: int = 0
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token; None: none
    skip_special_tokens: bool = True
    # Reasoning models: thinking tokens after which the engine closes the block (None: no cap).
    max_thinking_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.n < 1:
            raise InvalidRequestError(f"n must be at least 1, got {self.n}", "n")
        if self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be non-negative, got {self.temperature}", "temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}", "top_k")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens"
            )
        if self.seed_offset < 0:
            raise InvalidRequestError("seed_offset must be >= 0", "seed_offset")
        if self.min_tokens < 0:
            raise InvalidRequestError("min_tokens must be >= 0", "min_tokens")
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidRequestError("logprobs must be >= 0", "logprobs")
        if self.max_thinking_tokens is not None and self.max_thinking_tokens < 0:
            raise InvalidRequestError("max_thinking_tokens must be >= 0", "max_thinking_tokens")
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", "stop")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken; will recompute
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token id, or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"


@dataclass(slots=True, eq=False)
class Request:
    """The scheduler's state for one sequence. Only the scheduler and engine mutate it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    eos_token_id: int | None = None
    max_model_len: int | None = None
    priority: int = 0  # lower is more urgent, as in vLLM
    user: str | None = None
    request_class: str = "default"
    # Optional hints for policies: TTFT/TPOT targets (seconds), predicted output length.
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    output_len_hint: int | None = None
    # Requests of one `n>1` group share their prompt's blocks through the prefix cache;
    # a child waits until its parent has computed the prompt.
    parent_request_id: str | None = None
    # Simulated requests carry their true output length: they emit EOS there.
    true_output_len: int | None = None
    # Requests with different salts never share prefix-cache entries (one salt per tenant).
    cache_salt: str | None = None
    # The agent session this request is a turn of (heddle/sessions): its KV may be parked.
    session: SessionInfo | None = None
    # Structured output: the grammar its output must follow (a policy may weigh it: each
    # constrained sequence costs the step its own mask work).
    grammar: GrammarSpec | None = None
    # Admission order, set by the scheduler: breaks ties between equal arrival times.
    seq: int = 0
    # Reasoning models: the phase (thinking / answering), thinking tokens used, the budget.
    reasoning: ReasoningState | None = None

    all_token_ids: list[int] = field(default_factory=list)  # the prompt, then the outputs
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # What policies decide from (the record is for reports).
    first_token_time: float | None = None
    num_preemptions: int = 0
    record: RequestRecord = field(init=False)
    num_prompt_tokens: int = field(init=False)
    # The output length at which the request stops for length (max_tokens or the context),
    # and the total length that makes.
    max_output_tokens: int = field(init=False)
    max_num_tokens: int = field(init=False)
    # Token ids that end the request once min_tokens are out: EOS (unless ignore_eos) and the
    # stop token ids.
    stop_token_set: frozenset[int] = field(init=False)

    # -- bookkeeping of the KV cache manager (heddle/core/kv_cache.py) -----------------------
    # Chained hashes of the full blocks of all_token_ids, computed once each, kept across
    # preemption; the chain starts from `root_hash`.
    block_hashes: list[BlockHash] = field(default_factory=list)
    root_hash: BlockHash | None = None
    num_slots: int = 0  # tokens the request's block table can hold
    num_committed_blocks: int = 0  # leading blocks registered in (or found in) the prefix cache
    # The computed count at which the next block is full, so `update` commits it (kept by the
    # KV cache manager: (num_committed_blocks + 1) * block_size, or never without caching).
    commit_at: int = 0
    # -- bookkeeping of the scheduler ------------------------------------------------------
    order_key: tuple[float, ...] = ()  # the policy's key, when its queues stay ordered
    token_runs: array[int] = field(default_factory=lambda: array("q"))  # record.token_times.runs
    known_to_executor: bool = False  # sent as a NewRequest since it was last admitted
    num_slots_sent: int = 0  # num_slots when the executor last got the block table's end
    # Accounting at state changes (heddle/core/accounting.py): whether the request is out of
    # the step since `idle_*`, or in it since `busy_*`.
    idle: bool = True
    idle_stall_mark: float = 0.0
    idle_blocked_mark: float = 0.0
    busy_step_mark: int = 0
    busy_utilization_mark: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise InvalidRequestError("the prompt must contain at least one token", "prompt")
        self.all_token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        params = self.sampling_params
        limits = [1 << 62]
        if params.max_tokens is not None:
            limits.append(params.max_tokens)
        if self.max_model_len is not None:
            limits.append(self.max_model_len - len(self.prompt_token_ids))
        self.max_output_tokens = min(limits)
        self.max_num_tokens = self.num_prompt_tokens + self.max_output_tokens
        stops = set(params.stop_token_ids)
        if self.eos_token_id is not None and not params.ignore_eos:
            stops.add(self.eos_token_id)
        self.stop_token_set = frozenset(stops)
        self.record = RequestRecord(
            request_id=self.request_id,
            arrival_time=self.arrival_time,
            num_prompt_tokens=len(self.prompt_token_ids),
            request_class=self.request_class,
            user=self.user,
            ttft_slo=self.ttft_slo,
            tpot_slo=self.tpot_slo,
        )

    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens so far (a copy: hot paths read all_token_ids from
        num_prompt_tokens on)."""
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
