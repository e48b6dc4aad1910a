"""The engine: schedule -> execute -> update, and the bookkeeping around it.

The same Engine drives a ModelExecutor (a real forward pass, wall clock) and a
SimulatedExecutor (a cost model, virtual clock). Time passes inside `execute()` in both cases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from heddle.clock import Clock, WallClock
from heddle.config import EngineConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import SchedulerOutput, TokenLogprobs
from heddle.core.policies import Policy
from heddle.core.scheduler import Scheduler
from heddle.engine.detokenizer import IncrementalDetokenizer
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.errors import InvalidRequestError, QueueFullError
from heddle.executor import Executor
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat
from heddle.request import FinishReason, Request, RequestStatus, SamplingParams

if TYPE_CHECKING:
    from heddle.core.outputs import ExecutorOutput


class EngineTokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(slots=True)
class _Sequence:
    request: Request
    index: int
    detokenizer: IncrementalDetokenizer | None
    logprobs: list[TokenLogprobs] | None
    num_sent_tokens: int = 0  # output tokens already handed out in a RequestOutput
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


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        *,
        num_blocks: int,
        clock: Clock | None = None,
        tokenizer: EngineTokenizer | None = None,
        eos_token_id: int | None = None,
        max_model_len: int | None = None,
        vocab_size: int | None = None,
        policy: Policy | None = None,
        record_steps: bool = True,
        final_outputs_only: bool = False,
        kv_namespace: str = "",
    ) -> None:
        """`kv_namespace` names what makes this engine's KV differ from another's (the model);
        it is part of every prefix-cache hash."""
        self.config = config
        self.executor = executor
        self.clock: Clock = clock or WallClock()
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.kv_cache = KVCacheManager(
            num_blocks,
            config.cache.block_size,
            config.cache.enable_prefix_caching,
            namespace=kv_namespace,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv_cache, self.clock, policy)
        self.record_steps = record_steps
        # The simulator and batch users need only each request's last output: skip the rest.
        self.final_outputs_only = final_outputs_only
        self.step_stats: list[StepStat] = []
        self.finished_records: list[RequestRecord] = []
        self._groups: dict[str, _Group] = {}
        self._sequences: dict[str, tuple[_Group, _Sequence]] = {}
        # Wall seconds spent inside the executor vs. in the engine's own bookkeeping.
        self.execute_seconds = 0.0
        self.overhead_seconds = 0.0
        self.num_steps = 0

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> Engine:
        """An engine over the real model named in `config.model` (torch is imported here)."""
        from heddle.model.executor import ModelExecutor

        executor = ModelExecutor(config.model, config.cache)
        return cls(
            config,
            executor,
            num_blocks=executor.num_blocks,
            tokenizer=executor.tokenizer,
            eos_token_id=executor.eos_token_id,
            max_model_len=executor.max_model_len,
            vocab_size=executor.arch.vocab_size,
            kv_namespace=f"{executor.model_name}:{executor.dtype}",
            **kwargs,
        )

    # -- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        user: str | None = None,
        request_class: str = "default",
        ttft_slo: float | None = None,
        tpot_slo: float | None = None,
        output_len_hint: int | None = None,
        true_output_len: int | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request (n sequences when params.n > 1). Raises InvalidRequestError."""
        if request_id in self._groups:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        self._validate(prompt_token_ids, params)
        bound = self.config.scheduler.max_waiting
        if bound is not None and len(self.scheduler.waiting) + params.n > bound:
            # All n sequences of a request are queued, or none is.
            raise QueueFullError(
                f"the waiting queue is full ({len(self.scheduler.waiting)} of {bound} places "
                f"taken, {params.n} needed); retry later"
            )
        arrival = self.clock.now() if arrival_time is None else arrival_time
        group = _Group(request_id, prompt, list(prompt_token_ids))
        parent_id: str | None = None
        for index in range(params.n):
            seq_params = params
            if params.n > 1 and params.seed is not None:
                seq_params = _with_seed(params, params.seed + index)
            seq_id = request_id if params.n == 1 else f"{request_id}-{index}"
            request = Request(
                request_id=seq_id,
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=seq_params,
                arrival_time=arrival,
                eos_token_id=self.eos_token_id,
                max_model_len=self.max_model_len,
                priority=priority,
                user=user,
                request_class=request_class,
                ttft_slo=ttft_slo,
                tpot_slo=tpot_slo,
                output_len_hint=output_len_hint,
                parent_request_id=parent_id,
                true_output_len=true_output_len,
                cache_salt=cache_salt,
            )
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
            self.scheduler.add_request(request)
            group.sequences.append(sequence)
            self._sequences[seq_id] = (group, sequence)
            parent_id = parent_id or seq_id
        self._groups[request_id] = group

    def _validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt must contain at least one token", "prompt")
        if self.vocab_size is not None:
            bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"token id {bad[0]} is outside the vocabulary (size {self.vocab_size})",
                    "prompt",
                )
        limit = self.max_model_len
        if limit is not None:
            if len(prompt_token_ids) >= limit:
                raise InvalidRequestError(
                    f"the prompt has {len(prompt_token_ids)} tokens; this model's context is "
                    f"{limit} tokens and at least one must be left to generate",
                    "prompt",
                )
            if params.max_tokens is not None and len(prompt_token_ids) + params.max_tokens > limit:
                raise InvalidRequestError(
                    f"max_tokens={params.max_tokens} plus the prompt's {len(prompt_token_ids)} "
                    f"tokens exceeds this model's context of {limit} tokens",
                    "max_tokens",
                )

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its KV blocks return to the pool. Returns its final output."""
        group = self._groups.get(request_id)
        if group is None:
            return None
        for sequence in group.sequences:
            if not sequence.request.is_finished:
                self.scheduler.finish_request(sequence.request.request_id, FinishReason.ABORT)
        return self._group_output(group)

    def stop_sequence(self, request_id: str, index: int, stop: str) -> RequestOutput | None:
        """End sequence `index` of a request on a stop string found outside the engine (a front
        end that detokenizes); its KV blocks return to the pool. Returns the request's final
        output once every sequence has finished, else None."""
        group = self._groups.get(request_id)
        if group is None or not 0 <= index < len(group.sequences):
            return None
        request = group.sequences[index].request
        if not request.is_finished:
            self.scheduler.finish_request(request.request_id, FinishReason.STOP, stop)
        return self._group_output(group) if group.finished else None

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._groups)

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration. Returns an output for every request that got new tokens."""
        t0 = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            self.overhead_seconds += time.perf_counter() - t0
            return []
        start = self.clock.now()
        t1 = time.perf_counter()
        executor_output = self.executor.execute(scheduler_output)
        t2 = time.perf_counter()
        duration = self.clock.now() - start
        updated = self.scheduler.update(scheduler_output, executor_output)
        self._account_stalls(scheduler_output, start, duration)
        outputs = self._process(updated, executor_output)
        if self.record_steps:
            self._record_step(scheduler_output, start, duration)
        self.num_steps += 1
        t3 = time.perf_counter()
        self.execute_seconds += t2 - t1
        self.overhead_seconds += (t1 - t0) + (t3 - t2)
        return outputs

    def _process(
        self, updated: list[Request], executor_output: ExecutorOutput
    ) -> list[RequestOutput]:
        touched: dict[str, _Group] = {}
        for request in updated:
            group, sequence = self._sequences[request.request_id]
            if sequence.logprobs is not None:
                sequence.logprobs.extend(executor_output.logprobs.get(request.request_id, ()))
            detokenizer = sequence.detokenizer
            if detokenizer is not None:
                detokenizer.add_tokens(request.output_token_ids[sequence.num_detokenized :])
                sequence.num_detokenized = request.num_output_tokens
                if detokenizer.stop_hit is not None and not request.is_finished:
                    self.scheduler.finish_request(
                        request.request_id, FinishReason.STOP, detokenizer.stop_hit
                    )
                elif detokenizer.stop_hit is not None:
                    request.finish_reason = FinishReason.STOP
                    request.stop_reason = detokenizer.stop_hit
                    request.record.finish_reason = FinishReason.STOP.value
            if self.final_outputs_only and not group.finished:
                continue
            touched[group.request_id] = group
        return [self._group_output(group) for group in touched.values()]

    def _group_output(self, group: _Group) -> RequestOutput:
        completions = [self._completion(s) for s in group.sequences]
        finished = group.finished
        if finished:
            del self._groups[group.request_id]
            for sequence in group.sequences:
                del self._sequences[sequence.request.request_id]
                self.finished_records.append(sequence.request.record)
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
        token_ids = list(request.output_token_ids)
        delta_ids = token_ids[sequence.num_sent_tokens :]
        sequence.num_sent_tokens = len(token_ids)
        text = delta_text = ""
        if sequence.detokenizer is not None:
            delta_text = sequence.detokenizer.take_delta(finished)
            text = sequence.detokenizer.emitted_text
        reason = request.finish_reason.value if request.finish_reason is not None else None
        return CompletionOutput(
            index=sequence.index,
            text=text,
            token_ids=token_ids,
            finish_reason=reason,
            stop_reason=request.stop_reason,
            logprobs=list(sequence.logprobs) if sequence.logprobs is not None else None,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            metrics=request.record,
        )

    def _account_stalls(
        self, scheduler_output: SchedulerOutput, start: float, duration: float
    ) -> None:
        """Charge the step to every unfinished request that was ready but not in it."""
        if duration <= 0:
            return
        in_step = {s.request_id for s in scheduler_output.scheduled}
        longest = max(s.context_len for s in scheduler_output.scheduled)
        for request in self.scheduler.requests.values():
            if request.request_id in in_step or request.status is RequestStatus.FINISHED:
                continue
            charged = min(duration, start + duration - request.arrival_time)
            if charged <= 0:
                continue
            request.record.stall_time += charged
            if request.num_tokens < longest:
                request.record.blocked_by_longer_time += charged

    def _record_step(
        self, scheduler_output: SchedulerOutput, start: float, duration: float
    ) -> None:
        kv = self.kv_cache
        self.step_stats.append(
            StepStat(
                step_id=scheduler_output.step_id,
                start_time=start,
                duration=duration,
                num_prefill_tokens=scheduler_output.num_prefill_tokens,
                num_decode_tokens=scheduler_output.num_decode_tokens,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                kv_blocks_used=kv.num_used_blocks,
                kv_blocks_total=kv.num_blocks,
                request_ids=[s.request_id for s in scheduler_output.scheduled],
                token_budget=self.config.scheduler.max_num_batched_tokens,
            )
        )

    def check_integrity(self) -> None:
        """The scheduler and KV pool are consistent; with no request left, every block is free."""
        self.scheduler.check_integrity()
        if not self.scheduler.requests and self.kv_cache.num_used_blocks:
            raise AssertionError(f"{self.kv_cache.num_used_blocks} KV blocks leaked")


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, seed=seed)
