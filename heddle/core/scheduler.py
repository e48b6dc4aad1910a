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

A step costs what changed: a request that keeps decoding costs its row in the output and a
token in `update`; KV allocation and prefix-cache registration happen at block boundaries;
queues of policies with fixed order keys stay sorted; stall time and the other per-request
charges are made when a request's state changes (heddle/core/accounting.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heddle.clock import Clock
from heddle.config import SchedulerConfig
from heddle.core.accounting import Accounting, StallReason
from heddle.core.admission import Admission, SchedulerState, make_admission
from heddle.core.events import DecisionLog, Queue
from heddle.core.kv_cache import KVBlock, KVCacheManager
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.core.policies import Policy, SchedulerView, make_policy
from heddle.core.preemption_guard import PreemptionGuard
from heddle.core.queues import (
    ArrivalQueue,
    GroupedQueue,
    RankedQueue,
    WaitingQueue,
    insert_sorted,
)
from heddle.core.step_builder import StepBuilder
from heddle.errors import InvalidRequestError, QueueFullError
from heddle.metrics.record import TokenTimeline, TokenTimes
from heddle.request import FinishReason, Request, RequestStatus
from heddle.sessions.manager import SessionManager
from heddle.sessions.retention import make_retention
from heddle.spec.speculator import Speculator

RUNNING = RequestStatus.RUNNING


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A summary of the scheduler's state (for a router, a status page, metrics)."""

    num_running: int
    num_waiting: int
    num_preempted: int  # of the waiting, those preempted
    num_preemptions_total: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        clock: Clock,
        policy: Policy | None = None,
        *,
        timeline: TokenTimeline | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.clock = clock
        self.policy = policy or make_policy(config.policy, **config.policy_options)
        # Parked KV of paused agent sessions (heddle/sessions/manager.py).
        self.sessions = SessionManager(
            kv_cache,
            make_retention(config.retention, **config.retention_options),
            max_park_seconds=config.max_park_seconds,
        )
        self.admission = admission or make_admission(config.admission, **config.admission_options)
        self.preemption_guard = PreemptionGuard(
            config.max_recompute_ratio, config.recompute_window_seconds
        )
        self.requests: dict[str, Request] = {}
        # Whether any request ever had a reasoning state (set before it is added): until one
        # does, `update` does not ask each row.
        self._any_reasoning = False
        # Queues in the policy's order when its keys stay fixed, or re-keyed only when they
        # move (see heddle/core/queues.py); the policy says which queue it needs.
        self.waiting: WaitingQueue = self.policy.make_waiting_queue(self._order_key, clock.now)
        self._static_waiting = self.waiting.ordered
        self._static_running = not self.policy.running_order_changes
        # A policy that never lets a waiting request evict a running one: once the seats are
        # taken, admission is over, without asking `admit` of every request still waiting.
        self._preempts_for_waiting = (
            type(self.policy).should_preempt_for is not Policy.should_preempt_for
        )
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_finished = 0  # requests that left (any reason), for admission's service rate
        self._num_finished_observed = 0
        self._step_token_budget = config.max_num_batched_tokens  # the last step's (policy's)
        self.num_preempted_waiting = 0  # of the waiting requests, those preempted
        # Why ready requests were left out of steps, preemptions, evictions, recomputes
        # (heddle/core/events.py; None: off). Its stall intervals follow the accounting's.
        self.events = DecisionLog(config.decision_events) if config.decision_events else None
        events = self.events
        if events is not None:
            self.accounting = Accounting(on_idle=events.opened, on_busy=events.closed)
            events.cached_blocks_of = kv_cache.cached_block_ids
            kv_cache.events = events  # evictions go straight into its lists
        else:
            self.accounting = Accounting()
        # Every step's end time; token times of the records are indices into it.
        self.timeline = timeline if timeline is not None else TokenTimeline()
        self._next_step_id = 0
        self._next_seq = 0
        self._finished_since_last_step: list[str] = []
        self._unreported_finishes: list[Request] = []
        # Requests finished while building or updating the current step (any reason).
        self.finished_in_step: list[Request] = []
        self._scheduled: list[Request] = []  # the rows of the last output, in order
        # Speculative decoding (heddle/spec/): draft tokens for decoding requests, or None.
        self.speculator: Speculator | None = None
        if config.speculation.method != "off":
            self.speculator = Speculator(config.speculation)
        self._step_start = 0.0

    def _order_key(self, request: Request) -> tuple[float, ...]:
        return self.policy.sort_key(request, self.clock.now())

    # -- requests in and out ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.add_requests([request])

    def add_requests(self, requests: Sequence[Request]) -> None:
        """Queue requests (the n sequences of one client request): all of them, or none.

        Raises InvalidRequestError (a duplicate id, a prompt the KV cache cannot hold) or
        QueueFullError (the waiting queue bound: the one place it is checked; or admission
        control's refusal, asked once for the group, of its first request).
        """
        kv = self.kv_cache
        ids = set()
        for request in requests:
            if request.request_id in self.requests or request.request_id in ids:
                raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
            ids.add(request.request_id)
            if kv.blocks_needed(request.num_tokens + 1) > kv.num_blocks:
                raise InvalidRequestError(
                    f"the prompt needs {request.num_tokens + 1} tokens of KV cache but the "
                    f"cache holds {kv.num_blocks * kv.block_size}",
                    "prompt",
                )
        bound = self.config.max_waiting
        if bound is not None and len(self.waiting) + len(requests) > bound:
            raise QueueFullError(
                f"the waiting queue is full ({len(self.waiting)} of {bound} places taken, "
                f"{len(requests)} needed); retry later",
                request_class=requests[0].request_class if requests else None,
            )
        if requests:
            self._check_admission(requests[0])
        for offset, request in enumerate(requests):
            request.seq = self._next_seq + offset
        # Order keys first: a policy that cannot rank a request (oracle without a true
        # length) raises here, before anything is queued.
        keys = [self._order_key(r) for r in requests] if self._static_waiting else None
        for request in requests:
            self.sessions.on_arrival(request)  # raises if the session has a turn in flight
        self._next_seq += len(requests)
        for index, request in enumerate(requests):
            if request.reasoning is not None:
                self._any_reasoning = True
            times = request.record.token_times = TokenTimes(self.timeline)
            request.token_runs = times.runs
            self.requests[request.request_id] = request
            self.waiting.add(request, None if keys is None else keys[index])
            self.accounting.join(request)

    def _check_admission(self, request: Request) -> None:
        state = SchedulerState(
            now=self.clock.now(),
            waiting=self.waiting,
            running=self.running,
            policy=self.policy,
            max_num_seqs=self.config.max_num_seqs,
            token_budget=self.config.max_num_batched_tokens,
            guard=self.preemption_guard,
        )
        refusal = self.admission.check(request, state)
        if refusal is not None:
            self.policy.on_finished(request)  # drop whatever the policy learned of it
            raise QueueFullError(
                refusal.message,
                retry_after=refusal.retry_after,
                reason=refusal.reason,
                request_class=request.request_class,
            )

    def finish_request(
        self, request_id: str, reason: FinishReason, stop_reason: int | str | None = None
    ) -> Request | None:
        """End a request (stop string, abort, ...). Its blocks return to the pool now."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status is RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
            if request.status is RequestStatus.PREEMPTED:
                self.num_preempted_waiting -= 1
        self.sessions.on_finished(request, reason, self.clock.now(), self.waiting)
        self.kv_cache.free(request)
        self.sessions.on_freed(request, self.waiting)
        self.accounting.finish(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        request.record.finish_time = self.clock.now()
        request.record.finish_reason = reason.value
        self._finished_since_last_step.append(request_id)
        self.finished_in_step.append(request)
        if self.speculator is not None:
            self.speculator.forget((request_id,))
        self.num_finished += 1
        self.preemption_guard.forget(request_id)
        self.policy.on_finished(request)
        if self.events is not None and request.num_preemptions:  # only a preempted one is known
            self.events.finished(request)
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def take_unreported_finishes(self) -> list[Request]:
        """Requests the scheduler finished on its own in `schedule` (one that can never fit),
        which no `update` reported: the engine hands them out as finished."""
        finished, self._unreported_finishes = self._unreported_finishes, []
        return finished

    def stats(self) -> SchedulerStats:
        kv = self.kv_cache
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preempted=self.num_preempted_waiting,
            num_preemptions_total=self.num_preemptions,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks,
            prefix_cache_hit_rate=kv.prefix_hit_rate,
        )

    # -- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        self.finished_in_step = []
        kv = self.kv_cache
        self.sessions.expire(now)
        if isinstance(self.waiting, RankedQueue):
            self.waiting.refresh(now)  # the keys that moved since the last step
        policy = self.policy
        events = self.events
        if events is not None:
            events.begin_step(self._next_step_id, now)
        view = SchedulerView(
            now=now,
            running=self.running,
            waiting=self.waiting,
            token_budget=self.config.max_num_batched_tokens,
            max_num_seqs=self.config.max_num_seqs,
            num_free_blocks=kv.num_free_blocks,
            num_total_blocks=kv.num_blocks,
            block_size=kv.block_size,
            waiting_is_ordered=self._static_waiting,
        )
        limits = policy.step_limits(view)
        self._step_token_budget = limits.token_budget
        step = StepBuilder(
            limits.token_budget,
            limits.lane_budgets,
            self.config.long_prefill_token_threshold,
            kv,
            self._next_step_id,
        )
        preempted: list[Request] = []

        # 1. Running requests, most urgent first. Victims come from the ones not yet served.
        if self._static_running:
            ordered = list(self.running)
        else:
            ordered = policy.order_running(self.running, now)
        drafts = None
        if self.speculator is not None:
            drafts = self._plan_drafts(ordered, step)
        self._serve_running(ordered, step, preempted, now, drafts)

        # 2. Waiting requests, unless this step already had to preempt.
        if not preempted:
            self._admit_waiting(view, step, limits.max_num_seqs - len(self.running), preempted)
        elif events is not None and self.waiting:
            events.stop_queue(Queue.WAITING, StallReason.STEP_PREEMPTED)

        output = step.output
        tier = self.sessions.tier
        if tier is not None and output.request_ids:
            # The second tier's copies go with a step that runs (an empty one is not executed).
            output.offload_blocks, output.restore_blocks = tier.take_copies()
        if self.sessions.draft_orders and output.request_ids:
            # Sessions' news for a draft model's KV go with a step that runs, like the copies.
            output.draft_session_orders = self.sessions.take_draft_orders()
        output.finished_request_ids = self._finished_since_last_step
        output.preempted_request_ids = [r.request_id for r in preempted]
        self._scheduled = step.requests
        self._next_step_id += 1
        self._finished_since_last_step = []
        self._step_start = self.clock.now()
        return output

    def _plan_drafts(self, ordered: list[Request], step: StepBuilder) -> dict[str, list[int]]:
        """Draft tokens for the running requests that decode this step (heddle/spec/). They
        take only what the running requests' known tokens and the waiting prompts leave."""
        assert self.speculator is not None
        decoding = []
        base = 0
        for request in ordered:
            wanted = len(request.all_token_ids) - request.num_computed_tokens
            base += wanted
            if wanted == 1:
                decoding.append(request)
        left = step.tokens_left - base
        for request in self.waiting:
            if left <= 0:
                break
            left -= request.num_tokens
        if left <= 0 or not decoding:
            return {}
        return self.speculator.plan(decoding, min(base, step.tokens_left), left)

    def _serve_running(
        self,
        ordered: list[Request],
        step: StepBuilder,
        preempted: list[Request],
        now: float,
        drafts: dict[str, list[int]] | None = None,
    ) -> None:
        """Give each running request what it still needs of the budget, in `ordered`'s order.

        A decode (one token to compute, no lane caps) takes the fast path: its row is written
        here and the step's totals are added up once at the end; KV is allocated only when
        the token starts a new block. Everything else goes through `StepBuilder.grant/take`.
        """
        accounting = self.accounting
        kv = self.kv_cache
        lanes = bool(step.lane_left)
        so = step.output
        rows, ids, starts = step.requests, so.request_ids, so.num_computed_tokens
        news, samples = so.num_new_tokens, so.sample
        # The fast rows' totals are taken from the columns at the end (sum and max run in C):
        # what the general rows add is kept apart and taken off.
        fast_in_prompt = slow_rows = slow_starts = 0
        first_row = len(ids)
        plain = not lanes and not drafts
        tokens_left = step.tokens_left
        for index, request in enumerate(ordered):
            if request.status is not RUNNING:
                continue  # preempted earlier in this loop
            if tokens_left <= 0:
                for rest in ordered[index:]:
                    if rest.status is RUNNING and not rest.idle:
                        accounting.idle(rest, StallReason.TOKEN_BUDGET)
                if self.events is not None:
                    self.events.stop_queue(Queue.RUNNING, StallReason.TOKEN_BUDGET)
                break
            start = request.num_computed_tokens
            wanted = len(request.all_token_ids) - start
            if wanted == 1 and (plain or not (lanes or request.request_id in (drafts or ()))):
                # The decode fast path: StepBuilder.add_row for a one-token sampling row of a
                # request the executor knows (it was admitted in an earlier step); only a new
                # block needs telling it.
                if start >= request.num_slots:
                    fast = start == request.num_slots and kv.append_block(request)
                    if not fast and not self._allocate_or_preempt(
                        request, start + 1, ordered, index, preempted, now
                    ):
                        continue
                    step.tell_executor(request)
                elif not request.known_to_executor:
                    step.tell_executor(request)  # sent again whole (a forced token)
                tokens_left -= 1
                # Its num_new_tokens (1) and sample (True) are appended in a run, later.
                rows.append(request)
                ids.append(request.request_id)
                starts.append(start)
                if start < request.num_prompt_tokens:
                    fast_in_prompt += 1
                if request.idle:
                    accounting.busy(request)
                continue
            step.tokens_left = tokens_left
            lane = self.policy.lane_of(request) if lanes else ""
            proposal = drafts.get(request.request_id) if drafts and wanted == 1 else None
            if proposal:
                wanted += len(proposal)
            num_new = step.grant(lane, wanted)
            if num_new <= 0:
                if not request.idle:
                    accounting.idle(request, StallReason.LANE_CAP)
                if self.events is not None:
                    self.events.skip(request, StallReason.LANE_CAP)
                continue
            if start + num_new > request.num_slots and not self._allocate_or_preempt(
                request, start + num_new, ordered, index, preempted, now
            ):
                continue
            pending = len(ids) - len(news)
            if pending:
                news.extend([1] * pending)
                samples.extend([True] * pending)
            slow_rows += 1
            slow_starts += start
            if proposal and num_new > 1:
                step.take(request, lane, num_new, proposal[: num_new - 1])
            else:
                step.take(request, lane, num_new)
            tokens_left = step.tokens_left
            if request.idle:
                accounting.busy(request)
        step.tokens_left = tokens_left
        pending = len(ids) - len(news)
        if pending:
            news.extend([1] * pending)
            samples.extend([True] * pending)
        fast_rows = len(ids) - first_row - slow_rows
        if fast_rows:
            # A general row's start + 1 is at most its end, which the builder has counted in
            # the longest context already: the max over every row's start is exact.
            served = starts[first_row:] if first_row else starts
            fast_context = sum(served) - slow_starts + fast_rows
            step.add_decode_totals(fast_rows, fast_context, fast_in_prompt, max(served) + 1)

    def _allocate_or_preempt(
        self,
        request: Request,
        num_tokens: int,
        ordered: list[Request],
        index: int,
        preempted: list[Request],
        now: float,
    ) -> bool:
        """Blocks for `num_tokens` of running `request`, preempting the policy's victims (from
        those not yet served) until they fit. False when the request itself gave way."""
        kv = self.kv_cache
        while not kv.allocate_slots(request, num_tokens):
            if self._reclaim_parked(request, num_tokens, True):
                continue
            candidates = [r for r in ordered[index + 1 :] if r.status is RUNNING]
            candidates.append(request)
            victim = self.policy.choose_victim(candidates, now)
            if self.preemption_guard.enabled:
                victim = self.preemption_guard.forced_victim(victim, candidates, now)
            if victim is request and len(self.running) == 1:
                # Alone and still too big: it can never fit. Stop it rather than loop.
                self.finish_request(request.request_id, FinishReason.LENGTH)
                self._unreported_finishes.append(request)
                return False
            if self.events is not None:
                beneficiary = None if victim is request else request
                self.events.preempted(victim, beneficiary, StallReason.OUT_OF_BLOCKS)
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(
        self, view: SchedulerView, step: StepBuilder, seats: int, preempted: list[Request]
    ) -> None:
        kv = self.kv_cache
        policy = self.policy
        now = view.now
        admitted: list[Request] = []
        waiting = self.waiting
        events = self.events
        full = step.tokens_left <= 0
        closed = full or (seats <= 0 and not self._preempts_for_waiting)
        if closed and waiting and not isinstance(waiting, ArrivalQueue):
            # No one can be admitted: the order is not read (the loop below would stop at its
            # first request).
            if events is not None:
                reason = StallReason.TOKEN_BUDGET if full else StallReason.NO_SEAT
                events.stop_queue(Queue.WAITING, reason)
            return
        candidates = policy.waiting_candidates(waiting, now)
        # Once a request waits for memory, later ones may not overtake it, except turns whose
        # session's KV is parked: they hold their memory already.
        memory_blocked = False
        sessions = self.sessions
        # Changes to the waiting queue wait for the end of the loop: it iterates the queue.
        for request in candidates:
            if step.tokens_left <= 0 or (seats <= 0 and not self._preempts_for_waiting):
                if events is not None:
                    full = step.tokens_left <= 0
                    reason = StallReason.TOKEN_BUDGET if full else StallReason.NO_SEAT
                    events.stop_queue(Queue.WAITING, reason)
                break
            if memory_blocked and not sessions.has_parked(request):
                if events is not None:
                    events.skip(request, StallReason.OUT_OF_BLOCKS)
                continue
            if not self._parent_ready(request):
                if events is not None:
                    events.skip(request, StallReason.PARENT_NOT_READY)
                continue
            if not policy.admit(request, view, len(admitted)):
                if events is not None:
                    events.skip(request, StallReason.ADMISSION_HELD)
                continue
            if seats <= 0:
                if not self._preempt_for(
                    request, now, step, preempted, admitted, StallReason.NO_SEAT
                ):
                    if events is not None:
                        events.stop_queue(Queue.WAITING, StallReason.NO_SEAT)
                    break
                seats += 1
            if sessions.tier is not None:
                self._restore_session(request)
            cached_blocks = kv.find_cached_prefix(request)
            num_cached = len(cached_blocks) * kv.block_size
            lane = policy.lane_of(request)
            num_new = step.grant(lane, request.num_tokens - num_cached)
            if num_new <= 0:
                if events is not None:
                    events.skip(request, StallReason.LANE_CAP)
                continue
            while not kv.allocate_slots(request, num_cached + num_new, cached_blocks):
                wanted = num_cached + num_new
                if self._reclaim_parked(request, wanted, not self.running, cached_blocks):
                    continue
                if not self._preempt_for(
                    request, now, step, preempted, admitted, StallReason.OUT_OF_BLOCKS
                ):
                    break
            if not kv.has_blocks(request.request_id):
                if not sessions.parked:
                    # Out of blocks: later arrivals wait too, so no one overtakes for memory.
                    if events is not None:
                        events.stop_queue(Queue.WAITING, StallReason.OUT_OF_BLOCKS)
                    break
                if events is not None:
                    events.skip(request, StallReason.OUT_OF_BLOCKS)
                memory_blocked = True
                continue
            record = request.record
            if request.status is RequestStatus.WAITING:
                kv.record_prefix_lookup(request.num_prompt_tokens, num_cached)
                request.num_cached_tokens = num_cached
                record.num_cached_tokens = num_cached
            else:
                self.num_preempted_waiting -= 1
            request.num_computed_tokens = num_cached
            request.status = RUNNING
            sessions.on_admitted(request)
            request.known_to_executor = False
            if record.first_scheduled_time is None:
                record.first_scheduled_time = now
            admitted.append(request)
            step.take(request, lane, num_new)
            self.accounting.busy(request)
            if events is not None and request.num_preemptions:  # back: its recompute starts
                events.scheduled(request)
            seats -= 1
        for request in admitted:
            waiting.remove(request)
            if self._static_running:
                insert_sorted(self.running, request, self._order_key)
            else:
                self.running.append(request)
        for victim in preempted:
            waiting.add(victim)

    def _preempt_for(
        self,
        request: Request,
        now: float,
        step: StepBuilder,
        preempted: list[Request],
        admitted: list[Request],
        reason: StallReason,
    ) -> bool:
        """Let the policy evict a running request so that waiting `request` can start
        (`reason`: it needs a seat, or blocks)."""
        taken = {id(r) for r in admitted}
        candidates = [r for r in self.running if id(r) not in taken]
        if not candidates:
            return False
        victim = self.policy.choose_victim(candidates, now)
        if not self.policy.should_preempt_for(request, victim, now):
            return False
        if not self.preemption_guard.allows(victim, now):
            return False  # the recompute budget is spent, or the victim is still recomputing
        step.release(victim, self.policy.lane_of(victim))
        if self.events is not None:
            self.events.preempted(victim, request, reason)
        self._preempt(victim, requeue=False)
        preempted.append(victim)
        return True

    def _reclaim_parked(
        self,
        request: Request,
        num_tokens: int,
        must: bool,
        cached_blocks: Sequence[KVBlock] = (),
    ) -> bool:
        """Free parked sessions' blocks (the retention policy's order) so that `request`'s
        table can cover `num_tokens`. `must`: a running request would be preempted otherwise."""
        kv = self.kv_cache
        have = kv.num_request_blocks(request.request_id) + len(cached_blocks)
        # Cached blocks that sit in the free pool leave it when the request acquires them.
        reclaimed = sum(1 for b in cached_blocks if b.ref_count == 0)
        wanted = kv.blocks_needed(num_tokens) - have + reclaimed
        # The request's own session's blocks are what it resumes from: released only when
        # nothing else can run.
        session = request.session
        return self.sessions.reclaim(
            wanted,
            self.waiting,
            self.clock.now(),
            must=must,
            exclude=session.session_id if session is not None and not must else None,
        )

    def _restore_session(self, request: Request) -> None:
        """A turn whose session is in the second tier: copy its context back into the pool
        (freeing other parked sessions' blocks for it, in the retention policy's order)."""
        needed = self.sessions.restore_blocks_needed(request)
        if not needed:
            return
        if self.sessions.restore(request):
            return
        session = request.session
        assert session is not None
        if self.sessions.reclaim(
            needed, self.waiting, self.clock.now(), must=False, exclude=session.session_id
        ):
            self.sessions.restore(request)

    def _parent_ready(self, request: Request) -> bool:
        """A child of an n>1 group waits until its parent's prompt is computed (and cached)."""
        if request.parent_request_id is None:
            return True
        parent = self.requests.get(request.parent_request_id)
        return parent is None or parent.num_computed_tokens >= parent.num_prompt_tokens

    def _preempt(self, request: Request, requeue: bool = True) -> None:
        """Preemption by recompute: free the blocks; the request waits and later recomputes.

        `requeue=False`: the caller puts it back in the waiting queue (after iterating it)."""
        self.preemption_guard.charge(request, self.clock.now())
        self.kv_cache.free(request)
        self.running.remove(request)
        self.accounting.idle(request, StallReason.PREEMPTED)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.record.num_preemptions += 1
        self.num_preemptions += 1
        self.num_preempted_waiting += 1
        if requeue:
            self.waiting.add(request)

    def update(
        self,
        scheduler_output: SchedulerOutput,
        executor_output: ExecutorOutput,
        *,
        collect_updated: bool = True,
    ) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish requests that stopped.

        Returns the requests that received a token this step (finished ones included), and
        those the scheduler finished on its own while scheduling it; with
        `collect_updated=False`, only those that finished (`finished_in_step` has them all).
        """
        now = self.clock.now()
        self.accounting.end_step(
            now - self._step_start,
            scheduler_output.longest_context,
            scheduler_output.num_scheduled_tokens / self.config.max_num_batched_tokens,
        )
        if self.events is not None:
            self.events.end_step(now - self._step_start)  # what the accounting charged
        step_index = self.timeline.append(now)
        updated: list[Request] = self.take_unreported_finishes()
        sampled = executor_output.sampled_token_ids
        if not isinstance(sampled, list):
            raise TypeError("ExecutorOutput.sampled_token_ids is a list parallel to the rows")
        drafts = scheduler_output.draft_token_ids
        speculator = self.speculator
        if speculator is not None:
            speculator.observe_step(
                scheduler_output.num_scheduled_tokens, executor_output.step_duration
            )
        news = scheduler_output.num_new_tokens
        if len(sampled) != len(news):
            raise ValueError(
                f"ExecutorOutput has {len(sampled)} rows of sampled tokens, the step {len(news)}"
            )
        if not drafts:
            self._update_rows(news, sampled, now, step_index, updated if collect_updated else None)
        else:
            self._update_draft_rows(
                news, sampled, drafts, now, step_index, updated if collect_updated else None
            )
        self.policy.on_step_end(scheduler_output, executor_output.step_duration, now)
        self.preemption_guard.observe_step(now, scheduler_output.num_scheduled_tokens)
        self.admission.observe_step(
            now,
            executor_output.step_duration,
            scheduler_output,
            self.num_finished - self._num_finished_observed,
            self._step_token_budget,
        )
        self._num_finished_observed = self.num_finished
        return updated

    def _update_draft_rows(
        self,
        news: list[int],
        sampled: list[Sequence[int]],
        drafts: dict[str, list[int]],
        now: float,
        step_index: int,
        updated: list[Request] | None,
    ) -> None:
        """`update`'s rows of a step with draft tokens: rejected drafts are taken back."""
        kv = self.kv_cache
        speculator = self.speculator
        for request, num_new, token_ids in zip(self._scheduled, news, sampled, strict=True):
            if request.status is not RUNNING:
                continue  # finished while the step ran
            computed = request.num_computed_tokens + num_new
            if token_ids:
                # Rejected draft tokens were computed but do not count: their KV is garbage
                # past the computed tokens, overwritten as the request grows.
                proposed = drafts.get(request.request_id)
                if proposed:
                    computed -= len(proposed) + 1 - len(token_ids)
                    if speculator is not None:
                        speculator.observe(request.request_id, len(proposed), len(token_ids) - 1)
            request.num_computed_tokens = computed
            if computed >= request.commit_at:
                kv.commit_computed(request)
            if not token_ids:
                continue
            if request.reasoning is not None:
                self._append_reasoning(request, token_ids, now, step_index)
                if updated is not None:
                    updated.append(request)
                continue
            self._append_tokens(request, token_ids, now, step_index)
            if updated is not None:
                updated.append(request)

    def _update_rows(
        self,
        news: list[int],
        sampled: list[Sequence[int]],
        now: float,
        step_index: int,
        updated: list[Request] | None,
    ) -> None:
        """`update`'s rows of a step without draft tokens. A row that samples one token (the
        usual decode) appends it inline; a row of several tokens and a reasoning request take
        `_append_tokens` / `_append_reasoning`; a row without a token (a prefill chunk) only
        advances. The same effects, in the same order, as `_update_draft_rows` without drafts."""
        kv = self.kv_cache
        previous_step = step_index - 1
        reasoning = self._any_reasoning
        for request, num_new, token_ids in zip(self._scheduled, news, sampled, strict=True):
            if request.status is not RUNNING:
                continue  # finished while the step ran
            computed = request.num_computed_tokens = request.num_computed_tokens + num_new
            if computed >= request.commit_at:
                kv.commit_computed(request)  # a block was filled: into the prefix cache
            if len(token_ids) != 1 or (reasoning and request.reasoning is not None):
                if not token_ids:
                    continue
                if request.reasoning is not None:
                    self._append_reasoning(request, token_ids, now, step_index)
                else:
                    self._append_tokens(request, token_ids, now, step_index)
                if updated is not None:
                    updated.append(request)
                continue
            # One token: `_append_tokens`' loop body, inlined on the hot path (keep the two
            # in step: the golden test covers this path, tests/spec the multi-token one).
            token_id = token_ids[0]
            tokens = request.all_token_ids
            tokens.append(token_id)
            runs = request.token_runs
            if runs and runs[-1] == previous_step:
                runs[-1] = step_index  # the usual case: one more step in a row
            else:
                request.record.token_times.add(step_index)
                if len(tokens) == request.num_prompt_tokens + 1:
                    request.first_token_time = request.record.first_token_time = now
            if len(tokens) >= request.max_num_tokens or token_id in request.stop_token_set:
                self._finish_stopped(request, token_id, len(tokens) - request.num_prompt_tokens)
            if updated is not None:
                updated.append(request)

    def _append_tokens(
        self, request: Request, token_ids: Sequence[int], now: float, step_index: int
    ) -> None:
        """Append a row's sampled tokens (and their times), stopping at the first that ends
        the request."""
        runs = request.token_runs
        tokens = request.all_token_ids
        stops = request.stop_token_set
        previous_step = step_index - 1
        for token_id in token_ids:
            tokens.append(token_id)
            if runs and runs[-1] == previous_step:
                runs[-1] = step_index  # the usual case: one more step in a row
            else:
                request.record.token_times.add(step_index)
                if len(tokens) == request.num_prompt_tokens + 1:
                    request.first_token_time = request.record.first_token_time = now
            if len(tokens) >= request.max_num_tokens or (stops and token_id in stops):
                num_output = len(tokens) - request.num_prompt_tokens
                if self._finish_stopped(request, token_id, num_output):
                    break

    def _append_reasoning(
        self, request: Request, token_ids: Sequence[int], now: float, step_index: int
    ) -> None:
        """Append a reasoning request's tokens: its state sees every token, and a closing
        marker the thinking budget forces is appended as the next output token (computed by
        the next step like any known token); tokens after the cut, if a step brought several,
        are dropped. The executor did not sample the marker: the request is sent to it again
        whole (`known_to_executor`), with its tokens as they now are."""
        tokens = request.all_token_ids
        state = request.reasoning
        assert state is not None
        pending = list(token_ids)
        forced_any = False
        while pending:
            token_id = pending.pop(0)
            tokens.append(token_id)
            runs = request.token_runs
            if runs and runs[-1] == step_index - 1:
                runs[-1] = step_index
            else:
                request.record.token_times.add(step_index)
                if len(tokens) == request.num_prompt_tokens + 1:
                    request.first_token_time = request.record.first_token_time = now
            num_output = len(tokens) - request.num_prompt_tokens
            if self._finish_stopped(request, token_id, num_output):
                return
            forced = state.observe(token_id)
            if forced is not None:
                pending = [forced]
                forced_any = True
        if forced_any:
            request.num_computed_tokens = min(request.num_computed_tokens, len(tokens) - 1)
            request.known_to_executor = False

    def _finish_stopped(self, request: Request, token_id: int, num_output: int) -> bool:
        """Finish a request whose last token may stop it; False if it goes on (a stop token
        before min_tokens)."""
        params = request.sampling_params
        if num_output >= params.min_tokens:
            if token_id == request.eos_token_id and not params.ignore_eos:
                self.finish_request(request.request_id, FinishReason.STOP)
                return True
            if token_id in params.stop_token_ids:
                self.finish_request(request.request_id, FinishReason.STOP, token_id)
                return True
        if num_output >= request.max_output_tokens:
            self.finish_request(request.request_id, FinishReason.LENGTH)
            return True
        return False

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
        if self._static_running and [r.order_key for r in self.running] != sorted(
            r.order_key for r in self.running
        ):
            raise AssertionError("the running requests are out of order")
        if self._static_waiting:
            keys = [r.order_key for r in self.waiting]
            if keys != sorted(keys):
                raise AssertionError("the waiting queue is out of order")
        if isinstance(self.waiting, RankedQueue | GroupedQueue):
            self.waiting.check_integrity()
        for request in self.running:
            if request.status is not RUNNING:
                raise AssertionError(f"running request {request.request_id} is {request.status}")
            if not 0 <= request.num_computed_tokens <= request.num_tokens:
                raise AssertionError(f"request {request.request_id}: bad computed count")
        for request in self.waiting:
            if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise AssertionError(f"waiting request {request.request_id} is {request.status}")
            if request.num_computed_tokens:
                raise AssertionError(f"waiting request {request.request_id} has computed tokens")
            if not request.idle:
                raise AssertionError(f"waiting request {request.request_id} is accounted busy")
        preempted = sum(1 for r in self.waiting if r.status is RequestStatus.PREEMPTED)
        if preempted != self.num_preempted_waiting:
            raise AssertionError(
                f"{preempted} preempted requests wait, counted {self.num_preempted_waiting}"
            )
        if len(self.running) > self.config.max_num_seqs:
            raise AssertionError(
                f"{len(self.running)} running requests, max_num_seqs={self.config.max_num_seqs}"
            )
        self.kv_cache.check_integrity(self.running)
        self.sessions.check_integrity()
