"""Scheduling policies, one file each, chosen by name: `make_policy("fcfs")`."""

from heddle.core.policies.base import DEFAULT_LANE, Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import available_policies, make_policy, register

__all__ = [
    "DEFAULT_LANE",
    "Policy",
    "SchedulerView",
    "StepLimits",
    "available_policies",
    "make_policy",
    "register",
]
