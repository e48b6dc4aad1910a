"""Output processing: detokenization, stop strings, logprobs and `RequestOutput`s per group.

A group is the n sequences of one client request. After each step the engine hands this the
requests that got tokens (or finished); each sequence's detokenizer takes only the new
tokens, a stop string found in the text finishes the sequence in the scheduler, and one
`RequestOutput` per touched group carries the deltas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from heddle.core.outputs import TokenLogprobs
from heddle.engine.detokenizer import IncrementalDetokenizer
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.metrics.record import RequestRecord
from heddle.request import FinishReason, Request, RequestStatus


class EngineTokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


# finish(request_id, reason, stop string): ends a sequence in the scheduler.
Finisher = Callable[[str, FinishReason, str], object]


@dataclass(slots=True)
class _Sequence:
    request: Request
    index: int
    detokenizer: IncrementalDetokenizer | None
    logprobs: list[TokenLogprobs] | None
    num_sent_tokens: int = 0  # output tokens already handed out in a RequestOutput
    num_sent_logprobs: int = 0
    num_detokenized: int = 0  # output tokens already given to the detokenizer


@dataclass(slots=True)
class _Group:
    """The n sequences of one client request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[_Sequence] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.request.status is RequestStatus.FINISHED for s in self.sequences)


class OutputProcessor:
    def __init__(
        self,
        tokenizer: EngineTokenizer | None,
        finish: Finisher,
        *,
        final_outputs_only: bool = False,
        detach_records: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self._finish = finish
        # The simulator and batch users need only each request's last output: skip the rest.
        self.final_outputs_only = final_outputs_only
        # Finished records copy their token times out of the engine's shared timeline (which
        # a long-running engine then trims); the simulator keeps them on it (compact).
        self.detach_records = detach_records
        self.finished_records: list[RequestRecord] = []
        # Without a detokenizer and with final outputs only, an update matters only when a
        # request finishes: the engine then passes only those (unless logprobs are kept).
        self.needs_every_update = tokenizer is not None or not final_outputs_only
        self._groups: dict[str, _Group] = {}
        self._sequences: dict[str, tuple[_Group, _Sequence]] = {}

    def add(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        requests: list[Request],
    ) -> None:
        group = _Group(request_id, prompt, list(prompt_token_ids))
        for index, request in enumerate(requests):
            params = request.sampling_params
            detokenizer = None
            if self.tokenizer is not None:
                detokenizer = IncrementalDetokenizer(
                    self.tokenizer,
                    request.prompt_token_ids,
                    params.stop,
                    params.skip_special_tokens,
                )
            sequence = _Sequence(
                request, index, detokenizer, [] if params.logprobs is not None else None
            )
            group.sequences.append(sequence)
            self._sequences[request.request_id] = (group, sequence)
        self._groups[request_id] = group

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._groups

    def __len__(self) -> int:
        return len(self._groups)

    def live_requests(self) -> Iterable[Request]:
        """Every sequence of every group not yet handed out finished."""
        return (sequence.request for _, sequence in self._sequences.values())

    def group_requests(self, request_id: str) -> list[Request]:
        group = self._groups.get(request_id)
        return [s.request for s in group.sequences] if group is not None else []

    def process(
        self,
        updated: Iterable[Request],
        logprobs: dict[str, list[TokenLogprobs]] | None = None,
    ) -> list[RequestOutput]:
        """Outputs for the groups whose sequences got tokens or finished."""
        touched: dict[str, _Group] = {}
        sequences = self._sequences
        final_only = self.final_outputs_only
        for request in updated:
            entry = sequences.get(request.request_id)
            if entry is None:
                continue
            group, sequence = entry
            if sequence.logprobs is not None and logprobs:
                sequence.logprobs.extend(logprobs.get(request.request_id, ()))
            detokenizer = sequence.detokenizer
            if detokenizer is not None:
                first_new = request.num_prompt_tokens + sequence.num_detokenized
                detokenizer.add_tokens(request.all_token_ids[first_new:])
                sequence.num_detokenized = request.num_output_tokens
                stop = detokenizer.stop_hit
                if stop is not None and not request.is_finished:
                    self._finish(request.request_id, FinishReason.STOP, stop)
                elif stop is not None:
                    request.finish_reason = FinishReason.STOP
                    request.stop_reason = stop
                    request.record.finish_reason = FinishReason.STOP.value
            if final_only and not group.finished:
                continue
            touched[group.request_id] = group
        return [self.group_output(group) for group in touched.values()]

    def output_of(self, request_id: str) -> RequestOutput | None:
        group = self._groups.get(request_id)
        return self.group_output(group) if group is not None else None

    def group_output(self, group: _Group) -> RequestOutput:
        completions = [self._completion(s) for s in group.sequences]
        finished = group.finished
        if finished:
            del self._groups[group.request_id]
            for sequence in group.sequences:
                del self._sequences[sequence.request.request_id]
                record = sequence.request.record
                if self.detach_records:
                    record.token_times.detach()
                self.finished_records.append(record)
        first = group.sequences[0].request
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=completions,
            finished=finished,
            num_cached_tokens=first.num_cached_tokens,
        )

    def _completion(self, sequence: _Sequence) -> CompletionOutput:
        request = sequence.request
        finished = request.is_finished
        tokens = request.all_token_ids
        offset = request.num_prompt_tokens
        num_tokens = len(tokens) - offset
        delta_ids = tokens[offset + sequence.num_sent_tokens :]
        sequence.num_sent_tokens = num_tokens
        text, text_len, delta_text = "", 0, ""
        detokenizer = sequence.detokenizer
        if detokenizer is not None:
            delta_text = detokenizer.take_delta(finished)
            text, text_len = detokenizer.text, detokenizer.num_emitted
        logprobs, delta_logprobs = sequence.logprobs, None
        num_logprobs = 0
        if logprobs is not None:
            num_logprobs = len(logprobs)
            delta_logprobs = logprobs[sequence.num_sent_logprobs :]
            sequence.num_sent_logprobs = num_logprobs
        reason = request.finish_reason.value if request.finish_reason is not None else None
        return CompletionOutput(
            sequence.index,
            tokens=tokens,
            tokens_offset=offset,
            num_tokens=num_tokens,
            text=text,
            text_len=text_len,
            logprobs=logprobs,
            num_logprobs=num_logprobs,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            delta_logprobs=delta_logprobs,
            finish_reason=reason,
            stop_reason=request.stop_reason,
            metrics=request.record,
        )
