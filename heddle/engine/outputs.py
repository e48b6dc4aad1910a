"""What the engine hands back: per request, its completions so far (shaped like vLLM's).

An output carries what is new since the previous output of its request (`delta_text`,
`delta_token_ids`, `delta_logprobs`): a stream costs what it sends. The cumulative views
(`text`, `token_ids`, `logprobs`) are built when read, from the request's append-only lists
as they stood when the output was made, so making an output never copies a growing list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from heddle.core.outputs import TokenLogprobs
from heddle.metrics.record import RequestRecord


class CompletionOutput:
    """One sequence of a request: its deltas, and cumulative views built on demand."""

    __slots__ = (
        "_logprobs",
        "_num_logprobs",
        "_num_tokens",
        "_text",
        "_text_len",
        "_tokens",
        "_tokens_offset",
        "delta_logprobs",
        "delta_text",
        "delta_token_ids",
        "finish_reason",
        "index",
        "metrics",
        "stop_reason",
    )

    def __init__(
        self,
        index: int,
        *,
        tokens: Sequence[int],
        num_tokens: int,
        tokens_offset: int = 0,
        text: str = "",
        text_len: int = 0,
        logprobs: Sequence[TokenLogprobs] | None = None,
        num_logprobs: int = 0,
        delta_text: str = "",
        delta_token_ids: Sequence[int] = (),
        delta_logprobs: Sequence[TokenLogprobs] | None = None,
        finish_reason: str | None = None,  # "stop" | "length" | "abort" | None while running
        stop_reason: int | str | None = None,  # the stop string or stop token id that ended it
        metrics: RequestRecord | None = None,
    ) -> None:
        self.index = index
        # Append-only: the num_tokens from tokens_offset on never change.
        self._tokens = tokens
        self._tokens_offset = tokens_offset
        self._num_tokens = num_tokens
        self._text = text  # an immutable str; the first text_len characters are this output's
        self._text_len = text_len
        self._logprobs = logprobs
        self._num_logprobs = num_logprobs
        self.delta_text = delta_text
        self.delta_token_ids = list(delta_token_ids)
        self.delta_logprobs = None if delta_logprobs is None else list(delta_logprobs)
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.metrics = metrics

    @classmethod
    def of(
        cls,
        index: int,
        *,
        text: str,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprobs] | None = None,
        **rest: Any,
    ) -> CompletionOutput:
        """An output from whole lists (a front end that assembles deltas it received)."""
        return cls(
            index,
            tokens=list(token_ids),
            num_tokens=len(token_ids),
            text=text,
            text_len=len(text),
            logprobs=None if logprobs is None else list(logprobs),
            num_logprobs=0 if logprobs is None else len(logprobs),
            **rest,
        )

    @property
    def token_ids(self) -> list[int]:
        """Every output token id so far."""
        start = self._tokens_offset
        return list(self._tokens[start : start + self._num_tokens])

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def text(self) -> str:
        """The text handed out so far (never part of a stop string)."""
        return self._text[: self._text_len]

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        if self._logprobs is None:
            return None
        return list(self._logprobs[: self._num_logprobs])

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, num_tokens={self._num_tokens}, "
            f"delta_text={self.delta_text!r}, finish_reason={self.finish_reason!r})"
        )


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
