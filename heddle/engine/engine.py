"""The engine: schedule -> execute -> update, with input and output processing beside it.

The same Engine drives a ModelExecutor (a real forward pass, wall clock) and a
SimulatedExecutor (a cost model, virtual clock). Time passes inside `execute()` in both cases.

    add_request:  InputProcessor (validate, fan out n > 1) -> Scheduler.add_requests
    step:         Scheduler.schedule -> Executor.execute -> Scheduler.update
                  -> OutputProcessor (detokenize, stop strings, deltas) -> RequestOutputs
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from heddle.clock import Clock, WallClock
from heddle.config import EngineConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import SchedulerOutput
from heddle.core.policies import Policy
from heddle.core.scheduler import Scheduler
from heddle.engine.input_processor import InputProcessor
from heddle.engine.output_processor import EngineTokenizer, OutputProcessor
from heddle.engine.outputs import RequestOutput
from heddle.errors import HeddleError, InvalidRequestError
from heddle.executor import Executor
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepLog
from heddle.reasoning import Phase, ReasoningFormat, ReasoningState, thinking_budget
from heddle.request import FinishReason, Request, SamplingParams
from heddle.sessions.manager import copy_cost_of, recompute_cost_of
from heddle.sessions.retention import Costs
from heddle.sessions.session import session_info
from heddle.sessions.tier import SecondTier
from heddle.structured.spec import GrammarSpec
from heddle.structured.step import GrammarStep

if TYPE_CHECKING:
    from heddle.structured.matchers import GrammarMatchers

__all__ = ["Engine", "EngineTokenizer"]

# A long-running engine forgets the step times no live request refers to this often.
_TRIM_EVERY_STEPS = 4096


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
        record_step_requests: bool = False,
        final_outputs_only: bool = False,
        compact_records: bool = False,
        kv_namespace: str = "",
        reasoning_format: ReasoningFormat | None = None,
    ) -> None:
        """`kv_namespace` names what makes this engine's KV differ from another's (the model);
        it is part of every prefix-cache hash. `compact_records` keeps finished records' token
        times on the engine's shared timeline (a few bytes per request: the simulator) instead
        of copying them out (8 bytes per token; the timeline is then trimmed as requests
        finish, so a long-running server does not grow)."""
        self.config = config
        self.executor = executor
        self.clock: Clock = clock or WallClock()
        self.tokenizer = tokenizer
        # Reasoning models: every request's phase is tracked, and thinking budgets enforced.
        self.reasoning_format = reasoning_format
        self.kv_cache = KVCacheManager(
            num_blocks,
            config.cache.block_size,
            config.cache.enable_prefix_caching,
            namespace=kv_namespace,
            block_hash=config.cache.block_hash,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv_cache, self.clock, policy)
        sessions = self.scheduler.sessions
        recompute = recompute_cost_of(executor)
        copy = None
        if config.cache.offload_blocks:
            copy = copy_cost_of(executor)
            if copy is None:
                raise HeddleError(
                    f"offload_blocks={config.cache.offload_blocks}: this executor "
                    f"({type(executor).__name__}) has no second KV tier"
                )
            sessions.tier = SecondTier(config.cache.offload_blocks)
        if recompute is not None or copy is not None:
            sessions.costs = Costs(recompute or sessions.costs.recompute_seconds, copy)
        if getattr(executor, "draft", None) is not None:
            sessions.track_draft()  # a draft model's KV parks with the session's
        self.inputs = InputProcessor(
            eos_token_id=eos_token_id, max_model_len=max_model_len, vocab_size=vocab_size
        )
        self.outputs = OutputProcessor(
            tokenizer,
            self.scheduler.finish_request,
            final_outputs_only=final_outputs_only,
            detach_records=not compact_records,
        )
        self.compact_records = compact_records
        self.record_steps = record_steps
        self.record_step_requests = record_step_requests
        self.step_stats = StepLog()  # one row per step, in columns
        # Wall seconds spent inside the executor vs. in the engine's own bookkeeping.
        self.execute_seconds = 0.0
        self.overhead_seconds = 0.0
        self.num_steps = 0
        # Called on the engine's thread after each step's execute, before update (the view's
        # probe: heddle/view/probe.py): (scheduler output, step start, step duration).
        self.step_observer: Callable[[SchedulerOutput, float, float], None] | None = None
        # Matchers of the constrained sequences, keyed by request id; made on the first
        # grammar (they need the model's tokenizer: the simulator has none).
        self._grammars: GrammarMatchers | None = None
        self.overlap_grammar = True  # fill bitmasks while the forward pass runs
        # Constrained requests of an engine with nothing to mask with (the simulator): only
        # counted, so that each step's `num_constrained` charges their rows in the cost model.
        self._unmasked_grammars: set[str] = set()
        self._unsent_finishes: list[str] = []  # finishes told by an empty (unexecuted) step

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> Engine:
        """An engine over the real model named in `config.model` (torch is imported here)."""
        from heddle.model.executor import ModelExecutor
        from heddle.spec.draft import attach_draft_model

        executor = ModelExecutor(config.model, config.cache)
        attach_draft_model(executor, config.scheduler.speculation, config.model)
        if executor.tokenizer is not None and "reasoning_format" not in kwargs:
            kwargs["reasoning_format"] = ReasoningFormat.from_tokenizer(executor.tokenizer)
        return cls(
            config,
            executor,
            num_blocks=executor.num_blocks,
            tokenizer=executor.tokenizer,
            eos_token_id=executor.eos_token_id,
            max_model_len=executor.max_model_len,
            vocab_size=executor.model_shape.vocab_size,
            kv_namespace=f"{executor.model_name}:{executor.dtype}",
            **kwargs,
        )

    # -- what others read -------------------------------------------------------------------
    @property
    def eos_token_id(self) -> int | None:
        return self.inputs.eos_token_id

    @property
    def max_model_len(self) -> int | None:
        return self.inputs.max_model_len

    @property
    def vocab_size(self) -> int | None:
        return self.inputs.vocab_size

    @property
    def finished_records(self) -> list[RequestRecord]:
        """Records of the requests finished since the list was last emptied (by its reader)."""
        return self.outputs.finished_records

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
        session_id: str | None = None,
        parent_session_id: str | None = None,
        expected_pause: float | None = None,
        close_session: bool = False,
        tool: str | None = None,
        program_deadline: float | None = None,
        true_thinking_len: int | None = None,
        grammar: GrammarSpec | None = None,
    ) -> None:
        """Queue a request (n sequences when params.n > 1): all of them, or none.

        `session_id` makes it a turn of an agent session (heddle/sessions): its KV may stay
        parked for the session's next turn; `close_session` ends the session with this turn;
        `program_deadline` (seconds from this turn) is the whole program's deadline, which its
        later turns and sub-agents inherit (the `slo` policy).

        With a reasoning format, a thinking budget of 0 on a prompt that opens the thinking
        block closes it in the prompt (`ReasoningFormat.prepare_prompt`). Simulated requests
        may carry `true_thinking_len`: their phase turns after that many output tokens.

        `grammar`: the output must follow it (compiled here, once per grammar: a spec that does
        not compile raises InvalidRequestError before anything is queued).

        Raises InvalidRequestError, or QueueFullError when the waiting queue is at its bound.
        """
        if request_id in self.outputs:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        session = session_info(
            session_id, parent_session_id, expected_pause, close_session, tool, program_deadline
        )
        if session is not None and params.n > 1:
            raise InvalidRequestError("a session's turn must have n=1", "n")
        fmt = self.reasoning_format
        budget = thinking_budget(params.max_thinking_tokens, None, params.max_tokens)
        if fmt is not None:
            prompt_token_ids, _ = fmt.prepare_prompt(prompt_token_ids, budget)
        compiled = self._compile_grammar(grammar) if grammar is not None else None
        requests = self.inputs.make_requests(
            request_id,
            prompt_token_ids,
            params,
            self.clock.now() if arrival_time is None else arrival_time,
            priority=priority,
            user=user,
            request_class=request_class,
            ttft_slo=ttft_slo,
            tpot_slo=tpot_slo,
            output_len_hint=output_len_hint,
            true_output_len=true_output_len,
            cache_salt=cache_salt,
            session=session,
            grammar=grammar,
        )
        for request in requests:
            if true_thinking_len:
                request.reasoning = ReasoningState(
                    phase=Phase.THINKING, true_thinking_len=true_thinking_len
                )
            elif fmt is not None:
                request.reasoning = fmt.new_state(request.prompt_token_ids, budget)
        self.scheduler.add_requests(requests)
        self.outputs.add(request_id, prompt, prompt_token_ids, requests)
        if compiled is not None:
            assert self._grammars is not None
            for request in requests:
                self._grammars.add(request.request_id, compiled)
        elif grammar is not None:
            self._unmasked_grammars.update(request.request_id for request in requests)

    def _compile_grammar(self, grammar: GrammarSpec) -> Any:
        """The compiled grammar (cached), or None where nothing masks (the simulator, whose
        executor has no tokenizer).

        The model's own tokenizer comes from the executor: an engine core in its own process
        has no `self.tokenizer` (its front end detokenizes) but still masks."""
        tokenizer = getattr(self.executor, "tokenizer", None) or self.tokenizer
        if tokenizer is None or not hasattr(tokenizer, "backend"):
            return None
        if self._grammars is None:
            from heddle.structured.compiler import GrammarCompiler
            from heddle.structured.matchers import GrammarMatchers

            vocab_size = self.vocab_size or tokenizer.vocab_size  # type: ignore[union-attr]
            self._grammars = GrammarMatchers(GrammarCompiler(tokenizer, vocab_size))
        return self._grammars.compiler.compile(grammar, "response_format")

    @property
    def grammars(self) -> GrammarMatchers | None:
        """The matchers of the constrained sequences (None before the first grammar)."""
        return self._grammars

    def close_session(self, session_id: str) -> bool:
        """Close an agent session: its parked KV is freed now, a turn in flight parks nothing.
        False when the engine held nothing of it."""
        return self.scheduler.sessions.close(session_id)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its KV blocks return to the pool. Returns its final output."""
        requests = self.outputs.group_requests(request_id)
        if not requests:
            return None
        for request in requests:
            if not request.is_finished:
                self.scheduler.finish_request(request.request_id, FinishReason.ABORT)
        self._drop_grammars(requests)
        return self.outputs.output_of(request_id)

    def stop_sequence(self, request_id: str, index: int, stop: str) -> RequestOutput | None:
        """End sequence `index` of a request on a stop string found outside the engine (a front
        end that detokenizes); its KV blocks return to the pool. Returns the request's final
        output once every sequence has finished, else None."""
        requests = self.outputs.group_requests(request_id)
        if not 0 <= index < len(requests):
            return None
        request = requests[index]
        if not request.is_finished:
            self.scheduler.finish_request(request.request_id, FinishReason.STOP, stop)
        self._drop_grammars([request])
        if all(r.is_finished for r in requests):
            return self.outputs.output_of(request_id)
        return None

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.outputs)

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration. Returns an output for every request that got new tokens."""
        t0 = time.perf_counter()
        scheduler = self.scheduler
        scheduler_output = scheduler.schedule()
        if scheduler_output.is_empty:
            # Not executed: the finishes it tells of go with the next step that runs (the
            # executor's state for them, a draft model's KV among it, would stay forever).
            self._unsent_finishes.extend(scheduler_output.finished_request_ids)
            finished = scheduler.take_unreported_finishes()
            self._drop_grammars(finished)
            outputs = self.outputs.process(finished)
            self.overhead_seconds += time.perf_counter() - t0
            return outputs
        grammars = self._grammars
        masks = None
        if grammars is not None and len(grammars):
            masks = scheduler_output.token_masks = self._grammar_step(scheduler_output, grammars)
        elif self._unmasked_grammars:
            unmasked = self._unmasked_grammars
            so = scheduler_output
            so.num_constrained = sum(
                1 for rid, sample in zip(so.request_ids, so.sample, strict=True)
                if sample and rid in unmasked
            )  # fmt: skip
        if self._unsent_finishes:
            scheduler_output.finished_request_ids[:0] = self._unsent_finishes
            self._unsent_finishes = []
        start = self.clock.now()
        t1 = time.perf_counter()
        executor_output = self.executor.execute(scheduler_output)
        t2 = time.perf_counter()
        if self.step_observer is not None:
            self.step_observer(scheduler_output, start, self.clock.now() - start)
        every = self.outputs.needs_every_update or bool(executor_output.logprobs)
        every = every or masks is not None  # each constrained request's matcher advances
        updated = scheduler.update(scheduler_output, executor_output, collect_updated=every)
        if masks is not None:
            assert grammars is not None
            if masks.bitmask is not None:
                masks.bitmask.result()  # an executor that ignored the masks: the worker is done
            self._advance_grammars(grammars, updated)
        if (grammars is not None and len(grammars)) or self._unmasked_grammars:
            self._drop_grammars(scheduler.finished_in_step)  # whatever ended them
        if every:
            outputs = self.outputs.process(updated, executor_output.logprobs)
        else:
            outputs = self.outputs.process(scheduler.finished_in_step)
        if self.record_steps:
            self._record_step(scheduler_output, start, self.clock.now() - start)
        self.num_steps += 1
        if not self.compact_records and self.num_steps % _TRIM_EVERY_STEPS == 0:
            self._trim_timeline()
        t3 = time.perf_counter()
        self.execute_seconds += t2 - t1
        self.overhead_seconds += (t1 - t0) + (t3 - t2)
        return outputs

    def _grammar_step(
        self, scheduler_output: SchedulerOutput, grammars: GrammarMatchers
    ) -> GrammarStep | None:
        """The step's constrained sampling rows; their bitmask starts filling now."""
        so = scheduler_output
        constrained = [
            request_id
            for request_id, sample in zip(so.request_ids, so.sample, strict=True)
            if sample and request_id in grammars
        ]
        if not constrained:
            return None
        so.num_constrained = len(constrained)
        return grammars.start_step(constrained, self.overlap_grammar)

    def _advance_grammars(self, grammars: GrammarMatchers, updated: list[Request]) -> None:
        """Feed each constrained request its new tokens; stop it once its grammar is done."""
        for request in updated:
            request_id = request.request_id
            if request_id not in grammars or request.is_finished:
                continue
            accepted = grammars.accept(request_id, request.output_token_ids)
            if not accepted or grammars.is_terminated(request_id):
                # A rejected token cannot happen under the mask (it would be a grammar engine
                # bug); a terminated grammar admits nothing more (e.g. ignore_eos).
                self.scheduler.finish_request(request_id, FinishReason.STOP)

    def _drop_grammars(self, requests: list[Request]) -> None:
        grammars = self._grammars
        if grammars is not None:
            for request in requests:
                grammars.remove(request.request_id)
        unmasked = self._unmasked_grammars
        if unmasked:
            for request in requests:
                unmasked.discard(request.request_id)

    def _trim_timeline(self) -> None:
        """Forget the step times before the first token of every live request."""
        timeline = self.scheduler.timeline
        keep = len(timeline)
        for request in self.outputs.live_requests():
            first = request.record.token_times.first_index
            if first is not None and first < keep:
                keep = first
        timeline.trim(keep)

    def _record_step(
        self, scheduler_output: SchedulerOutput, start: float, duration: float
    ) -> None:
        kv = self.kv_cache
        scheduler = self.scheduler
        self.step_stats.record(
            scheduler_output.step_id,
            start,
            duration,
            scheduler_output.num_prefill_tokens,
            scheduler_output.num_decode_tokens,
            len(scheduler.running),
            len(scheduler.waiting),
            kv.num_used_blocks,
            kv.num_blocks,
            self.config.scheduler.max_num_batched_tokens,
            scheduler_output.num_rows,
            scheduler_output.request_ids if self.record_step_requests else None,
        )

    def check_integrity(self) -> None:
        """The scheduler and KV pool are consistent; with no request left, every block not
        parked for a session is free."""
        self.scheduler.check_integrity()
        kv = self.kv_cache
        if not self.scheduler.requests and kv.num_used_blocks != kv.num_parked_blocks:
            raise AssertionError(
                f"{kv.num_used_blocks - kv.num_parked_blocks} KV blocks leaked "
                f"({kv.num_parked_blocks} parked)"
            )
