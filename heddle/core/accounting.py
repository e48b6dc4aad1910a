"""Accounting at state changes: stall time, time blocked by longer requests, steps taken and
step utilization, charged when a request enters or leaves a step, never by visiting every
request every step.

A request is *busy* while it is in the steps the scheduler builds, *idle* while it is ready
but left out (waiting, preempted, or running but skipped). The accounting keeps running sums
over steps (their durations; their utilizations; per context length, the durations of the
steps whose longest request was longer) and marks each request with the sums when its state
changes; the difference is what it is charged when it changes again:
- stall time: the durations of the steps it sat out;
- blocked by longer: those of them whose longest request had more context than it has;
- steps and utilization: the steps it was in, and their tokens / budget.
This is what charging each step to each left-out request would give, up to the rounding of
the sums.

Each idle period starts with a reason (`StallReason`) where the scheduler knows it; decision
events (heddle/core/events.py: why a ready request did not run) hook `on_idle` and `on_busy`,
so their stall intervals open and close exactly where the stall time is charged.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.request import Request


class StallReason(enum.Enum):
    """Why a ready request is not in a step (as far as the scheduler knows when it leaves)."""

    QUEUED = "queued"  # waiting; not reached, or behind the queue's head
    NO_SEAT = "no_seat"  # the running cap (max_num_seqs, or the policy's) is full
    TOKEN_BUDGET = "token_budget"  # the step's tokens were spent
    LANE_CAP = "lane_cap"  # its lane's share of the step was spent
    ADMISSION_HELD = "admission_held"  # the policy's admit() said not yet
    OUT_OF_BLOCKS = "out_of_blocks"  # the KV pool could not hold it
    PARENT_NOT_READY = "parent_not_ready"  # an n>1 child waits for its parent's prompt
    PREEMPTED = "preempted"  # its blocks were taken; it waits to recompute
    STEP_PREEMPTED = "step_preempted"  # the step had to preempt, so it admitted no one


class _LongerSums:
    """For each length L, the summed duration of the steps whose longest context was > L.

    A Fenwick tree over context lengths: a step adds its duration at its longest context;
    `query(L)` sums the steps at positions > L. It doubles when a longer context comes.
    """

    __slots__ = ("_points", "_total", "_tree")

    def __init__(self, size: int = 1024) -> None:
        self._tree = array("d", bytes(8 * (size + 1)))  # 1-based; position p holds length p-1
        self._points = array("d", bytes(8 * (size + 1)))  # each position's own sum
        self._total = 0.0

    def add(self, longest: int, duration: float) -> None:
        i = longest + 1
        if i >= len(self._tree):
            self._grow(i)
        self._total += duration
        self._points[i] += duration
        tree = self._tree
        size = len(tree) - 1
        while i <= size:
            tree[i] += duration
            i += i & -i

    def query(self, length: int) -> float:
        """Durations of the steps whose longest context exceeded `length`."""
        tree = self._tree
        i = min(length + 1, len(tree) - 1)  # the positions of lengths 0..length
        below = 0.0
        while i > 0:
            below += tree[i]
            i -= i & -i
        return self._total - below

    def _grow(self, position: int) -> None:
        size = len(self._tree) - 1
        while size < position:
            size *= 2
        points = self._points
        self._points = array("d", bytes(8 * (size + 1)))
        self._points[: len(points)] = points
        tree = self._tree = array("d", bytes(8 * (size + 1)))
        for p in range(1, len(points)):
            value = points[p]
            if value:
                i = p
                while i <= size:
                    tree[i] += value
                    i += i & -i


class Accounting:
    """The running sums over steps, and the charges at each request's state changes."""

    def __init__(
        self,
        on_idle: Callable[[Request, StallReason], None] | None = None,
        on_busy: Callable[[Request], None] | None = None,
    ) -> None:
        self.stall_clock = 0.0  # summed duration of the steps so far
        self.utilization_clock = 0.0  # summed tokens / budget of the steps so far
        self.num_steps = 0
        self.num_idle = 0  # requests idle now (nothing to charge a step to when there are none)
        self._longer = _LongerSums()
        self.on_idle = on_idle  # a request's idle period starts (decision events)
        self.on_busy = on_busy  # it ends: the request is in a step, or has finished

    def end_step(self, duration: float, longest_context: int, utilization: float) -> None:
        """A step ran: `duration` on the engine's clock, its longest request's context."""
        self.num_steps += 1
        self.utilization_clock += utilization
        # Only differences of the sums are ever charged, and only to requests idle across
        # them: a step no one sat out need not be added.
        if duration > 0 and self.num_idle:
            self.stall_clock += duration
            self._longer.add(longest_context, duration)

    def join(self, request: Request, reason: StallReason = StallReason.QUEUED) -> None:
        """A new request: idle from now."""
        request.idle = True
        self.num_idle += 1
        request.idle_stall_mark = self.stall_clock
        request.idle_blocked_mark = self._longer.query(request.num_tokens)
        if self.on_idle is not None:
            self.on_idle(request, reason)

    def idle(self, request: Request, reason: StallReason) -> None:
        """A busy request is left out of this step (skipped, preempted)."""
        if request.idle:
            return
        self._close_busy(request)
        self.join(request, reason)

    def busy(self, request: Request) -> None:
        """An idle request is in this step."""
        if not request.idle:
            return
        self._close_idle(request)
        if self.on_busy is not None:
            self.on_busy(request)
        request.idle = False
        self.num_idle -= 1
        request.busy_step_mark = self.num_steps
        request.busy_utilization_mark = self.utilization_clock

    def finish(self, request: Request) -> None:
        if request.idle:
            self._close_idle(request)
            self.num_idle -= 1
            if self.on_busy is not None:
                self.on_busy(request)
        else:
            self._close_busy(request)

    def _close_idle(self, request: Request) -> None:
        record = request.record
        stall = self.stall_clock - request.idle_stall_mark
        if stall > 0:
            record.stall_time += stall
            blocked = self._longer.query(request.num_tokens) - request.idle_blocked_mark
            if blocked > 0:
                record.blocked_by_longer_time += blocked

    def _close_busy(self, request: Request) -> None:
        record = request.record
        record.num_steps += self.num_steps - request.busy_step_mark
        record.step_utilization_sum += self.utilization_clock - request.busy_utilization_mark
