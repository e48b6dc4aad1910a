"""The front end's side of one request: token ids in from the core, text and outputs out.

The core sends only what is new for each sequence (`Delta`); this keeps the whole output,
detokenizes it incrementally, finds stop strings (holding back text that could begin one) and
builds the same RequestOutput the in-process engine gives, so the HTTP layer cannot tell where
the engine runs.
"""

from __future__ import annotations

from typing import Any

from heddle.core.outputs import TokenLogprobs
from heddle.engine.async_engine import RequestStream
from heddle.engine.detokenizer import IncrementalDetokenizer
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.engine.wire import Delta, Stop
from heddle.request import SamplingParams


class SequenceState:
    __slots__ = (
        "detokenizer",
        "finish_reason",
        "index",
        "logprobs",
        "num_sent",
        "stop_reason",
        "token_ids",
    )

    def __init__(self, index: int, detokenizer: IncrementalDetokenizer | None, logprobs: bool):
        self.index = index
        self.token_ids: list[int] = []
        self.detokenizer = detokenizer
        self.logprobs: list[TokenLogprobs] | None = [] if logprobs else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_sent = 0  # tokens already handed out in an output


class RequestState:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        stream: RequestStream,
        tokenizer: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.stream = stream
        self.num_cached_tokens = 0
        self.sequences = [
            SequenceState(
                index,
                IncrementalDetokenizer(
                    tokenizer, prompt_token_ids, params.stop, params.skip_special_tokens
                )
                if tokenizer is not None
                else None,
                params.logprobs is not None,
            )
            for index in range(params.n)
        ]

    def apply(self, delta: Delta) -> Stop | None:
        """Take one sequence's news; returns the Stop to send when a stop string ended it."""
        sequence = self.sequences[delta.index]
        if sequence.finish_reason is not None:
            return None  # ended here on a stop string: what the core made since is dropped
        sequence.token_ids.extend(delta.token_ids)
        if sequence.logprobs is not None and delta.logprobs:
            sequence.logprobs.extend(delta.logprobs)
        self.num_cached_tokens = delta.num_cached_tokens
        detokenizer = sequence.detokenizer
        if detokenizer is not None and delta.token_ids:
            detokenizer.add_tokens(delta.token_ids)
            if detokenizer.stop_hit is not None:
                sequence.finish_reason = "stop"
                sequence.stop_reason = detokenizer.stop_hit
                if delta.finish_reason is None:
                    return Stop(self.request_id, delta.index, detokenizer.stop_hit)
                return None
        if delta.finish_reason is not None:
            sequence.finish_reason = delta.finish_reason
            sequence.stop_reason = delta.stop_reason
        return None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    def output(self) -> RequestOutput:
        completions = []
        for s in self.sequences:
            done = s.finish_reason is not None
            delta_ids = s.token_ids[s.num_sent :]
            s.num_sent = len(s.token_ids)
            text = delta_text = ""
            if s.detokenizer is not None:
                delta_text = s.detokenizer.take_delta(done)
                text = s.detokenizer.emitted_text
            completions.append(
                CompletionOutput.of(
                    s.index,
                    text=text,
                    token_ids=s.token_ids,
                    finish_reason=s.finish_reason,
                    stop_reason=s.stop_reason,
                    logprobs=s.logprobs,
                    delta_text=delta_text,
                    delta_token_ids=delta_ids,
                )
            )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=completions,
            finished=self.finished,
            num_cached_tokens=self.num_cached_tokens,
        )
