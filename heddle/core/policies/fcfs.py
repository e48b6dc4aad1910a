"""First come, first served: the baseline every other policy is measured against."""

from __future__ import annotations

from heddle.core.policies.base import Policy
from heddle.core.policies.registry import register


@register
class FCFSPolicy(Policy):
    """Serve and admit in arrival order; preempt the latest arrival when blocks run out."""

    name = "fcfs"
    waiting_order_changes = False  # (arrival time, seq): fixed for good
    running_order_changes = False
