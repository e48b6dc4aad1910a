"""What the engine hands back: per request, its completions so far (shaped like vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from heddle.core.outputs import TokenLogprobs
from heddle.metrics.record import RequestRecord


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    logprobs: list[TokenLogprobs] | None = None
    # What is new since the previous output of this request (for streaming).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    metrics: RequestRecord | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0

    @property
    def metrics(self) -> RequestRecord | None:
        """The timing record of the first completion (the only one when n == 1)."""
        return self.outputs[0].metrics if self.outputs else None
