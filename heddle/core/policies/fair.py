"""Per-user fairness by virtual token counters (VTC; Sheng et al., OSDI'24).

Each user has a counter of the weighted service it has received: `input_weight` per prompt
token computed, `output_weight` per token generated. The backlogged user with the smallest
counter is served first. When a user becomes backlogged after idling, its counter is lifted to
the smallest counter among the users already backlogged (or, if none is, to the largest counter
of the users who left last): work-conserving, and no credit is banked while idle. Counters of
idle users at or below that floor are forgotten, so memory follows the active users.

Agent sessions: a program's work counts toward its user. A turn (or sub-agent) that names no
`user` is charged to the user an earlier turn of its program named; a program whose turns never
name one is a tenant of its own (`program:<id>`), not part of the anonymous crowd: a long agent
program is one user however many calls it makes.

Within one step the counters only move at the step's end, so admission interleaves users by
their counters plus the prompt tokens already handed out this step, as VTC charges at admission.

The waiting requests are kept per user in arrival order (`GroupedQueue`): a step looks at the
users, not at every request, and the interleaving is read lazily, as far as admission goes.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import register
from heddle.core.queues import GroupedQueue, OrderKey, WaitingQueue

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.request import Request

ANONYMOUS = "<anonymous>"


def user_of(request: Request) -> str:
    return request.user if request.user is not None else ANONYMOUS


MAX_PROGRAMS = 65_536  # programs whose user is remembered (least recently seen forgotten)


@register
class FairPolicy(Policy):
    """Serve the backlogged user with the least weighted service first."""

    name = "fair"

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        super().__init__()
        if input_weight < 0 or output_weight < 0 or input_weight + output_weight <= 0:
            raise ValueError("weights must be >= 0 and not both zero")
        self.input_weight = float(input_weight)
        self.output_weight = float(output_weight)
        self.counters: dict[str, float] = {}
        self._active: set[str] = set()  # users with a waiting or running request
        self._last_left_counter = 0.0
        # request_id -> (user, prompt length), for on_step_end
        self._users: dict[str, tuple[str, int]] = {}
        self._finished: list[str] = []
        self._prune_at = 32  # prune forgotten users' counters when the table grows past this
        self._program_users: OrderedDict[str, str] = OrderedDict()  # program -> its user

    def user_of(self, request: Request) -> str:
        """Who the request's work counts toward: its user, else its program's."""
        session = request.session
        if session is None:
            return user_of(request)
        program = session.program_id
        users = self._program_users
        if request.user is not None:
            users[program] = request.user
            users.move_to_end(program)
            if len(users) > MAX_PROGRAMS:
                users.popitem(last=False)
            return request.user
        return users.get(program, f"program:{program}")

    def counter(self, user: str) -> float:
        return self.counters.get(user, 0.0)

    def make_waiting_queue(self, key: OrderKey, now: Callable[[], float]) -> WaitingQueue:
        return GroupedQueue(self.user_of)

    def step_limits(self, view: SchedulerView) -> StepLimits:
        users = self._users
        waiting = view.waiting
        if isinstance(waiting, GroupedQueue):
            # Waiting requests are entered in `_users` as admission reads them (the only ones
            # that can run this step); the users with a waiting request are the groups.
            active = set(waiting.groups)
            requests: Iterable[Request] = view.running
        else:
            active = set()
            requests = (*view.running, *waiting)
        for request in requests:
            user = self.user_of(request)
            users[request.request_id] = (user, request.num_prompt_tokens)
            active.add(user)
        staying = self._active & active
        left = self._active - active
        if left:
            self._last_left_counter = max(self.counter(u) for u in left)
        floor = min(self.counter(u) for u in staying) if staying else self._last_left_counter
        for user in active - self._active:
            self.counters[user] = max(self.counter(user), floor)
        self._active = active
        if len(self.counters) > self._prune_at:
            # An idle user at or below the floor would be lifted to it on return anyway: its
            # counter says nothing, and a server meets many users once. The next prune waits
            # for the table to double, so idle users above the floor cost no scan per step.
            for user in [u for u, c in self.counters.items() if u not in active and c <= floor]:
                del self.counters[user]
            self._prune_at = max(32, 2 * len(self.counters))
        return StepLimits(view.token_budget, view.max_num_seqs)

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        return (self.counter(self.user_of(request)), request.arrival_time, request.seq)

    def _interleave(self, requests: Collection[Request], now: float) -> list[Request]:
        queues: dict[str, list[Request]] = {}
        for request in sorted(requests, key=lambda r: (r.arrival_time, r.seq)):
            queues.setdefault(self.user_of(request), []).append(request)
        return list(self._interleave_queues(queues))

    def _interleave_queues(self, queues: dict[str, list[Request]]) -> Iterator[Request]:
        """Repeatedly take the earliest request of the user with the smallest provisional
        counter, charging it what the request would get this step (prompt left + one token).
        `queues`: each user's requests, earliest first."""
        heap = [(self.counter(u), q[0].seq, u) for u, q in queues.items()]
        heapq.heapify(heap)
        positions = dict.fromkeys(queues, 0)
        while heap:
            provisional, _, user = heapq.heappop(heap)
            queue = queues[user]
            request = queue[positions[user]]
            positions[user] += 1
            if positions[user] < len(queue):
                # Charged as the request stands before admission reads it (which may change
                # its computed tokens: a prefix hit).
                prompt_left = max(0, request.num_prompt_tokens - request.num_computed_tokens)
                charge = self.input_weight * prompt_left + self.output_weight
                heapq.heappush(heap, (provisional + charge, queue[positions[user]].seq, user))
            yield request

    def order_waiting(self, waiting: Collection[Request], now: float) -> list[Request]:
        return self._interleave(waiting, now)

    def waiting_candidates(self, waiting: WaitingQueue, now: float) -> Iterable[Request]:
        if not isinstance(waiting, GroupedQueue):
            return super().waiting_candidates(waiting, now)
        return self._read_waiting(waiting)

    def _read_waiting(self, waiting: GroupedQueue) -> Iterator[Request]:
        users = self._users
        for request in self._interleave_queues(waiting.groups):
            users[request.request_id] = (self.user_of(request), request.num_prompt_tokens)
            yield request

    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        return self._interleave(running, now)

    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        so = scheduler_output
        for request_id, start, num_new, sample in zip(
            so.request_ids, so.num_computed_tokens, so.num_new_tokens, so.sample, strict=True
        ):
            entry = self._users.get(request_id)
            if entry is None:
                continue
            user, num_prompt_tokens = entry
            # Prompt positions computed this step (recomputed outputs after a preemption are
            # the scheduler's doing, not the user's: not charged), plus the token sampled.
            prompt_tokens = max(0, min(start + num_new, num_prompt_tokens) - start)
            service = self.input_weight * prompt_tokens
            if sample:
                service += self.output_weight
            self.counters[user] = self.counter(user) + service
        for request_id in self._finished:
            self._users.pop(request_id, None)
        self._finished.clear()

    def on_finished(self, request: Request) -> None:
        self._finished.append(request.request_id)
        session = request.session
        if session is not None and session.close and session.parent_session_id is None:
            self._program_users.pop(session.session_id, None)  # the program's last turn
