"""round-robin: each request to the next healthy replica in turn; blind to load and caches."""

from __future__ import annotations

from collections.abc import Sequence

from heddle.router.base import RouterPolicy
from heddle.router.registry import register
from heddle.router.state import ReplicaState, RouteRequest


@register
class RoundRobin(RouterPolicy):
    """Each request to the next healthy replica in turn (the baseline)."""

    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        # The first healthy replica at or after the cursor, so a dead one is skipped, not
        # replaced by its neighbour twice in a row.
        chosen = next((r for r in replicas if r.replica_id >= self._next), replicas[0])
        self._next = (chosen.replica_id + 1) % self.context.num_replicas
        return chosen
