"""Shortest TRUE remaining work first: the upper bound `sjf` is measured against.

Simulator only: it reads `Request.true_output_len`, which only simulated workloads carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heddle.core.policies.registry import register
from heddle.core.policies.sjf import RemainingWorkPolicy
from heddle.errors import HeddleError

if TYPE_CHECKING:
    from heddle.request import Request


@register
class OraclePolicy(RemainingWorkPolicy):
    """Like `sjf` (same aging and prompt weight) with a perfect output-length predictor."""

    name = "oracle"
    needs_true_output_len = True
    # True remaining work only changes as a request computes: not while it waits.
    waiting_order_changes = False

    def predicted_output_len(self, request: Request) -> float:
        if request.true_output_len is None:
            raise HeddleError(
                f"policy 'oracle' needs each request's true output length, and request "
                f"{request.request_id!r} has none; use it with the simulator or a workload "
                "that carries output lengths"
            )
        return float(request.true_output_len)
