"""Strict priority with preemption and aging.

`Request.priority`: lower is more urgent. A waiting request of strictly higher priority may
evict a running one of lower priority when seats or blocks are short. Aging keeps the order
starvation-free: a request's effective priority improves by one level for every
`aging_seconds` since its arrival, so its sort key is a "virtual arrival time"
`arrival_time + priority * aging_seconds`. That key does not change with time, so two requests
never swap places and preemption cannot ping-pong; a request that has waited long enough is
ahead of every later arrival, whatever their priority.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy
from heddle.core.policies.registry import register

if TYPE_CHECKING:
    from heddle.request import Request


@register
class PriorityPolicy(Policy):
    """Most urgent (aged) priority first; preempt strictly lower priorities for seats/blocks."""

    name = "priority"
    # The key (virtual arrival time) does not move with time: both queues stay sorted.
    waiting_order_changes = False
    running_order_changes = False

    def __init__(self, aging_seconds: float = 10.0, preempt: bool = True) -> None:
        super().__init__()
        if not (aging_seconds > 0 and math.isfinite(aging_seconds)):
            raise ValueError(f"aging_seconds must be positive and finite, got {aging_seconds}")
        self.aging_seconds = float(aging_seconds)
        self.preempt = preempt

    def effective_priority(self, request: Request, now: float) -> float:
        """Priority level after aging: one level better per `aging_seconds` since arrival."""
        return request.priority - (now - request.arrival_time) / self.aging_seconds

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        # Ordering by effective priority at `now` is ordering by this time-free key.
        virtual_arrival = request.arrival_time + request.priority * self.aging_seconds
        return (virtual_arrival, request.arrival_time, request.seq)

    def should_preempt_for(self, request: Request, victim: Request, now: float) -> bool:
        # Strictly higher raw priority (no churn within a level), and not overtaken by aging:
        # a low-priority request that has aged past the newcomer keeps its place.
        return (
            self.preempt
            and request.priority < victim.priority
            and self.sort_key(request, now) < self.sort_key(victim, now)
        )
