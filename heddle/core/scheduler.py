"""The iteration-level scheduler: the mechanism. Decisions are delegated to a Policy.

There is no prefill phase and no decode phase. Each request has `all_token_ids` and
`num_computed_tokens`; each step gives some requests a number of tokens to compute, so that
`num_computed_tokens` catches up with `len(all_token_ids)`. Chunked prefill, prefix-cache hits,
resumption after preemption and decoding all follow from that one rule. A step that brings a
request to the end of its known tokens also samples its next token.

Per step: running requests are served first (in the policy's order), each taking what it needs
of the token budget; when blocks run out the policy names a victim, which is preempted by
recompute (its blocks are freed and it waits again; nothing is lost). Then, if no one was
preempted, waiting requests are admitted in the policy's order while seats, budget and blocks
last, their prompts chunked to fit the budget that is left.
"""

from __future__ import annotations

from heddle.clock import Clock
from heddle.config import SchedulerConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import ExecutorOutput, ScheduledRequest, SchedulerOutput
from heddle.core.policies import Policy, SchedulerView, make_policy
from heddle.errors import InvalidRequestError, QueueFullError
from heddle.request import FinishReason, Request, RequestStatus


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        clock: Clock,
        policy: Policy | None = None,
    ) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.clock = clock
        self.policy = policy or make_policy(config.policy, **config.policy_options)
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._next_step_id = 0
        self._next_seq = 0
        self._finished_since_last_step: list[str] = []

    # -- requests in and out ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
        bound = self.config.max_waiting
        if bound is not None and len(self.waiting) >= bound:
            raise QueueFullError(f"the waiting queue is full ({bound} requests); retry later")
        if self.kv_cache.blocks_needed(request.num_tokens + 1) > self.kv_cache.num_blocks:
            raise InvalidRequestError(
                f"the prompt needs {request.num_tokens + 1} tokens of KV cache but the cache holds "
                f"{self.kv_cache.num_blocks * self.kv_cache.block_size}",
                "prompt",
            )
        request.seq = self._next_seq
        self._next_seq += 1
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(
        self, request_id: str, reason: FinishReason, stop_reason: int | str | None = None
    ) -> Request | None:
        """End a request (stop string, abort, ...). Its blocks return to the pool now."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache.free(request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        request.record.finish_time = self.clock.now()
        request.record.finish_reason = reason.value
        self._finished_since_last_step.append(request_id)
        self.policy.on_finished(request)
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        kv = self.kv_cache
        view = SchedulerView(
            now=now,
            running=self.running,
            waiting=self.waiting,
            token_budget=self.config.max_num_batched_tokens,
            max_num_seqs=self.config.max_num_seqs,
            num_free_blocks=kv.num_free_blocks,
            num_total_blocks=kv.num_blocks,
            block_size=kv.block_size,
        )
        limits = self.policy.step_limits(view)
        step = _StepBudget(
            limits.token_budget, limits.lane_budgets, self.config.long_prefill_token_threshold
        )
        preempted: list[Request] = []

        # 1. Running requests, most urgent first. Victims come from the ones not yet served.
        ordered = self.policy.order_running(self.running, now)
        for index, request in enumerate(ordered):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if step.tokens_left <= 0:
                break
            lane = self.policy.lane_of(request)
            num_new = step.grant(lane, request.num_uncomputed_tokens)
            if num_new <= 0:
                continue
            while not kv.allocate_slots(request.request_id, request.num_computed_tokens + num_new):
                candidates = [r for r in ordered[index + 1 :] if r.status is RequestStatus.RUNNING]
                candidates.append(request)
                victim = self.policy.choose_victim(candidates, now)
                if victim is request and len(self.running) == 1:
                    # Alone and still too big: it can never fit. Stop it rather than loop.
                    self.finish_request(request.request_id, FinishReason.LENGTH)
                    break
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                step.take(request, lane, num_new)

        # 2. Waiting requests, unless this step already had to preempt.
        if not preempted:
            self._admit_waiting(view, step, limits.max_num_seqs - len(self.running), preempted)

        return self._build_output(step, preempted)

    def _admit_waiting(
        self, view: SchedulerView, step: _StepBudget, seats: int, preempted: list[Request]
    ) -> None:
        kv = self.kv_cache
        now = view.now
        admitted: list[Request] = []
        for request in self.policy.order_waiting(self.waiting, now):
            if step.tokens_left <= 0:
                break
            if not self._parent_ready(request):
                continue
            if not self.policy.admit(request, view, len(admitted)):
                continue
            if seats <= 0:
                if not self._preempt_for(request, now, step, preempted, admitted):
                    break
                seats += 1
            cached_blocks, cached_hashes = kv.find_cached_prefix(
                request.all_token_ids, request.cache_salt
            )
            num_cached = len(cached_blocks) * kv.block_size
            lane = self.policy.lane_of(request)
            num_new = step.grant(lane, request.num_tokens - num_cached)
            if num_new <= 0:
                continue
            while not kv.allocate_slots(
                request.request_id,
                num_cached + num_new,
                cached_blocks,
                cached_hashes,
                request.cache_salt,
            ):
                if not self._preempt_for(request, now, step, preempted, admitted):
                    break
            if not kv.has_blocks(request.request_id):
                break  # out of blocks: later arrivals wait too, so no one overtakes for memory
            if request.status is RequestStatus.WAITING:
                kv.record_prefix_lookup(request.num_prompt_tokens, num_cached)
                request.num_cached_tokens = num_cached
                request.record.num_cached_tokens = num_cached
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.record.first_scheduled_time is None:
                request.record.first_scheduled_time = now
            self.running.append(request)
            admitted.append(request)
            step.take(request, lane, num_new)
            seats -= 1
        if admitted:
            taken = {id(r) for r in admitted}
            self.waiting = [r for r in self.waiting if id(r) not in taken]

    def _preempt_for(
        self,
        request: Request,
        now: float,
        step: _StepBudget,
        preempted: list[Request],
        admitted: list[Request],
    ) -> bool:
        """Let the policy evict a running request so that waiting `request` can start."""
        taken = {id(r) for r in admitted}
        candidates = [r for r in self.running if id(r) not in taken]
        if not candidates:
            return False
        victim = self.policy.choose_victim(candidates, now)
        if not self.policy.should_preempt_for(request, victim, now):
            return False
        step.release(victim, self.policy.lane_of(victim))
        self._preempt(victim)
        preempted.append(victim)
        return True

    def _parent_ready(self, request: Request) -> bool:
        """A child of an n>1 group waits until its parent's prompt is computed (and cached)."""
        if request.parent_request_id is None:
            return True
        parent = self.requests.get(request.parent_request_id)
        return parent is None or parent.num_computed_tokens >= parent.num_prompt_tokens

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: free the blocks; the request waits and later recomputes."""
        self.kv_cache.free(request.request_id)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.record.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(request)

    def _build_output(self, step: _StepBudget, preempted: list[Request]) -> SchedulerOutput:
        kv = self.kv_cache
        scheduled = []
        for request, num_new in step.granted.values():
            start = request.num_computed_tokens
            scheduled.append(
                ScheduledRequest(
                    request_id=request.request_id,
                    token_ids=request.all_token_ids[start : start + num_new],
                    start_position=start,
                    block_table=kv.block_ids(request.request_id),
                    sample=start + num_new == request.num_tokens,
                    sampling_params=request.sampling_params,
                    num_prompt_tokens=request.num_prompt_tokens,
                    num_output_tokens=request.num_output_tokens,
                    true_output_len=request.true_output_len,
                    eos_token_id=request.eos_token_id,
                )
            )
        output = SchedulerOutput(
            step_id=self._next_step_id,
            scheduled=scheduled,
            finished_request_ids=self._finished_since_last_step,
            preempted_request_ids=[r.request_id for r in preempted],
        )
        self._next_step_id += 1
        self._finished_since_last_step = []
        return output

    def update(
        self, scheduler_output: SchedulerOutput, executor_output: ExecutorOutput
    ) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish requests that stopped.

        Returns the requests that received a token this step (finished ones included).
        """
        now = self.clock.now()
        kv = self.kv_cache
        updated: list[Request] = []
        utilization = scheduler_output.num_scheduled_tokens / self.config.max_num_batched_tokens
        for scheduled in scheduler_output.scheduled:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            request.num_computed_tokens += len(scheduled.token_ids)
            request.record.num_steps += 1
            request.record.step_utilization_sum += utilization
            kv.commit_computed(
                request.request_id, request.all_token_ids, request.num_computed_tokens
            )
            if not scheduled.sample:
                continue
            token_ids = executor_output.sampled_token_ids.get(request.request_id)
            if not token_ids:
                raise RuntimeError(f"executor sampled no token for {request.request_id}")
            record = request.record
            for token_id in token_ids:
                request.append_output_token(token_id)
                if record.first_token_time is None:
                    record.first_token_time = now
                record.token_times.append(now)
                reason, stop_reason = self._stop_reason(request, token_id)
                if reason is not None:
                    self.finish_request(request.request_id, reason, stop_reason)
                    break
            updated.append(request)
        self.policy.on_step_end(scheduler_output, executor_output.step_duration, now)
        return updated

    def check_integrity(self) -> None:
        """Raise AssertionError where the scheduler's or the KV cache's state is inconsistent."""
        running_ids = [r.request_id for r in self.running]
        waiting_ids = [r.request_id for r in self.waiting]
        if len(set(running_ids)) != len(running_ids) or len(set(waiting_ids)) != len(waiting_ids):
            raise AssertionError("a request is queued twice")
        if set(running_ids) & set(waiting_ids):
            raise AssertionError("a request is both running and waiting")
        if self.requests.keys() != set(running_ids) | set(waiting_ids):
            raise AssertionError("the request table and the queues disagree")
        for request in self.running:
            if request.status is not RequestStatus.RUNNING:
                raise AssertionError(f"running request {request.request_id} is {request.status}")
            if not 0 <= request.num_computed_tokens <= request.num_tokens:
                raise AssertionError(f"request {request.request_id}: bad computed count")
        for request in self.waiting:
            if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise AssertionError(f"waiting request {request.request_id} is {request.status}")
            if request.num_computed_tokens:
                raise AssertionError(f"waiting request {request.request_id} has computed tokens")
        if len(self.running) > self.config.max_num_seqs:
            raise AssertionError(
                f"{len(self.running)} running requests, max_num_seqs={self.config.max_num_seqs}"
            )
        self.kv_cache.check_integrity({r.request_id: r.num_computed_tokens for r in self.running})

    @staticmethod
    def _stop_reason(request: Request, token_id: int) -> tuple[FinishReason | None, int | None]:
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens:
            if token_id == request.eos_token_id and not params.ignore_eos:
                return FinishReason.STOP, None
            if params.stop_token_ids and token_id in params.stop_token_ids:
                return FinishReason.STOP, token_id
        if num_output >= request.max_output_tokens:
            return FinishReason.LENGTH, None
        return None, None


class _StepBudget:
    """The token budget of one step, per lane, and what has been granted so far."""

    __slots__ = ("granted", "lane_left", "long_prefill_threshold", "tokens_left")

    def __init__(
        self, token_budget: int, lane_budgets: dict[str, int], threshold: int | None
    ) -> None:
        self.tokens_left = token_budget
        self.lane_left = dict(lane_budgets)
        self.long_prefill_threshold = threshold
        self.granted: dict[str, tuple[Request, int]] = {}

    def grant(self, lane: str, wanted: int) -> int:
        """How many of `wanted` tokens fit now."""
        num = min(wanted, self.tokens_left)
        if self.long_prefill_threshold is not None:
            num = min(num, self.long_prefill_threshold)
        if lane in self.lane_left:
            num = min(num, self.lane_left[lane])
        return num

    def take(self, request: Request, lane: str, num: int) -> None:
        self.granted[request.request_id] = (request, num)
        self.tokens_left -= num
        if lane in self.lane_left:
            self.lane_left[lane] -= num

    def release(self, request: Request, lane: str) -> None:
        entry = self.granted.pop(request.request_id, None)
        if entry is None:
            return
        self.tokens_left += entry[1]
        if lane in self.lane_left:
            self.lane_left[lane] += entry[1]
