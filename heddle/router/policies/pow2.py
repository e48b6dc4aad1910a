"""pow2: power of two choices (Ray Serve's default router): two replicas at random, the one
with the shorter queue."""

from __future__ import annotations

from collections.abc import Sequence

from heddle.router.base import RouterPolicy
from heddle.router.registry import register
from heddle.router.state import ReplicaState, RouteRequest


def pick_two(rng_sample: list[ReplicaState]) -> ReplicaState:
    return min(rng_sample, key=lambda r: (r.num_requests, r.outstanding_tokens))


@register
class PowerOfTwoChoices(RouterPolicy):
    """Two replicas at random; the one with fewer requests in flight (Ray Serve's default)."""

    name = "pow2"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        if len(replicas) == 1:
            return replicas[0]
        return pick_two(self.rng.sample(list(replicas), 2))
