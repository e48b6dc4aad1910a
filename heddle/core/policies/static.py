"""Request-level (static) batching: the lock-step baseline that iteration-level scheduling beats.

A batch is admitted together and runs until its last member finishes; nothing new is admitted
while any member is unfinished. Members preempted for memory stay members and are re-admitted.
This policy exists for comparison only: short members idle behind the longest one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import register

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.request import Request


@register
class StaticBatchPolicy(Policy):
    """Admit a batch in arrival order when the previous batch has wholly finished."""

    name = "static"
    waiting_order_changes = False  # arrival order
    running_order_changes = False

    def __init__(self) -> None:
        super().__init__()
        self._batch: set[str] = set()  # unfinished members of the current batch
        self._joining: set[str] = set()  # admitted while the batch was open, not yet confirmed

    @property
    def batch(self) -> frozenset[str]:
        return frozenset(self._batch)

    def step_limits(self, view: SchedulerView) -> StepLimits:
        self._joining.clear()
        return StepLimits(view.token_budget, view.max_num_seqs)

    def admit(self, request: Request, view: SchedulerView, num_admitted: int) -> bool:
        if self._batch:
            return request.request_id in self._batch
        # The batch is open: everything the scheduler admits this step becomes a member.
        self._joining.add(request.request_id)
        return True

    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        if self._joining:
            ran = set(scheduler_output.request_ids)
            self._batch |= self._joining & ran
            self._joining.clear()

    def on_finished(self, request: Request) -> None:
        self._batch.discard(request.request_id)
        self._joining.discard(request.request_id)
