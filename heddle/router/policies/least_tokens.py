"""least-tokens: the replica with the fewest outstanding tokens (vLLM data-parallel's idea,
counted in tokens rather than requests so a long prompt weighs what it costs)."""

from __future__ import annotations

from collections.abc import Sequence

from heddle.router.base import RouterPolicy, least_loaded
from heddle.router.registry import register
from heddle.router.state import ReplicaState, RouteRequest


@register
class LeastOutstandingTokens(RouterPolicy):
    """The replica with the fewest outstanding tokens (prompt left to compute + output left)."""

    name = "least-tokens"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        return least_loaded(replicas)
