"""The policy interface: the decisions a scheduler delegates.

The scheduler owns the mechanism (token budget, block allocation, chunking, preemption by
recompute). A policy decides:
- the order in which running and waiting requests are served (`order_running`, `order_waiting`),
- whether a waiting request may be admitted now (`admit`),
- which request gives up its blocks when memory runs out (`choose_victim`), and whether a
  waiting request may take the place of a running one (`should_preempt_for`),
- how large this step is and what share of it each lane may take (`step_limits`, `lane_of`).
Hooks (`on_step_end`, `on_finished`) let a policy learn from what ran.

A policy also says whether its order can change while requests sit in a queue
(`waiting_order_changes`, `running_order_changes`). When it cannot (the key depends only on
the request's own state, which does not change while it waits, or never), the scheduler keeps
the queue sorted by a key computed once per insertion instead of sorting every step; a policy
that overrides `order_waiting` / `order_running` must leave the flag True.

How the waiting requests are kept is the policy's choice (`make_waiting_queue`, see
heddle/core/queues.py): a policy whose waiting keys move only at times or events it can name
(slo, mlfq, sjf) takes a `RankedQueue` and says when (`key_change_time`, `take_moved`,
`keys_epoch`); fair takes a `GroupedQueue` and reads the head of each user's requests. The
scheduler reads the waiting requests in the policy's order through `waiting_candidates`, which
may be lazy: admission stops reading as soon as seats or budget run out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from heddle.core.queues import ArrivalQueue, OrderedQueue, OrderKey, RankedQueue, WaitingQueue

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.request import Request

DEFAULT_LANE = "default"


@dataclass(slots=True)
class StepLimits:
    """The size of one step. `lane_budgets` caps the tokens each lane may take (absent: no cap)."""

    token_budget: int
    max_num_seqs: int
    lane_budgets: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class SchedulerView:
    """What a policy may see of the scheduler at the start of a step (read-only by convention)."""

    now: float
    running: Sequence[Request]
    waiting: Collection[Request]  # in the policy's order when `waiting_is_ordered`
    token_budget: int  # the configured budget
    max_num_seqs: int  # the configured cap
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    waiting_is_ordered: bool = False


class Policy:
    """FCFS-shaped defaults; subclasses override only the decisions they change."""

    name = "base"
    # Simulator-only policies (e.g. `oracle`) read a request's true output length.
    needs_true_output_len = False
    # Can sort_key(request, now) of a waiting (running) request change before it leaves the
    # queue? True (the safe default): the scheduler sorts the queue every step.
    waiting_order_changes = True
    running_order_changes = True

    def __init__(self, **options: object) -> None:
        if options:
            raise ValueError(f"policy {self.name!r} takes no options {sorted(options)}")
        # Bumped when the policy's own state changed every waiting key (a RankedQueue re-keys).
        self.keys_epoch = 0

    # -- order ------------------------------------------------------------------------------
    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        """Smaller serves first and is preempted last. Default: arrival order."""
        return (request.arrival_time, request.seq)

    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        return sorted(running, key=lambda r: self.sort_key(r, now))

    def order_waiting(self, waiting: Collection[Request], now: float) -> list[Request]:
        return sorted(waiting, key=lambda r: self.sort_key(r, now))

    def first_waiting(self, view: SchedulerView, count: int) -> list[Request]:
        """The first `count` waiting requests in this policy's order."""
        if view.waiting_is_ordered:
            return list(itertools.islice(view.waiting, count))
        if isinstance(view.waiting, RankedQueue):
            return view.waiting.in_order(view.now)[:count]
        return self.order_waiting(view.waiting, view.now)[:count]

    # -- the waiting queue ------------------------------------------------------------------
    def make_waiting_queue(self, key: OrderKey, now: Callable[[], float]) -> WaitingQueue:
        """The queue the scheduler keeps this policy's waiting requests in. `key` is the
        request's order key at the clock's time; `now` reads the clock."""
        return ArrivalQueue() if self.waiting_order_changes else OrderedQueue(key)

    def waiting_candidates(self, waiting: WaitingQueue, now: float) -> Iterable[Request]:
        """The waiting requests in this policy's order, as admission reads them (it may stop
        early: the iterable may be lazy). The queue must not change while it is read."""
        if waiting.ordered:
            return waiting
        if isinstance(waiting, RankedQueue):
            return waiting.in_order(now)
        return self.order_waiting(list(waiting), now)

    def key_change_time(self, request: Request, now: float) -> float | None:
        """With a RankedQueue: the earliest time after `now` at which the order key of waiting
        `request` may change by itself (None: not before an event `take_moved` reports)."""
        return None

    def take_moved(self) -> list[str]:
        """With a RankedQueue: ids of waiting requests whose keys this policy changed since the
        last call (the scheduler re-keys them)."""
        return []

    # -- admission and preemption -----------------------------------------------------------
    def admit(self, request: Request, view: SchedulerView, num_admitted: int) -> bool:
        """May `request` start now? `num_admitted` were admitted earlier in this step."""
        return True

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        """The request to preempt when blocks run out: by default the one served last."""
        return max(candidates, key=lambda r: self.sort_key(r, now))

    def should_preempt_for(self, request: Request, victim: Request, now: float) -> bool:
        """May waiting `request` evict running `victim` to get a seat or blocks? Default no."""
        return False

    # -- step shape -------------------------------------------------------------------------
    def step_limits(self, view: SchedulerView) -> StepLimits:
        return StepLimits(view.token_budget, view.max_num_seqs)

    def lane_of(self, request: Request) -> str:
        return DEFAULT_LANE

    # -- hooks ------------------------------------------------------------------------------
    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        """Called after every step with what ran and how long it took."""

    def on_finished(self, request: Request) -> None:
        """Called once when a request finishes (for any reason)."""
