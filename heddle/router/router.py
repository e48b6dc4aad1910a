"""The Router: replica states, a policy, and the bookkeeping around each decision.

Pure Python and synchronous: the simulator's event loop and the server's asyncio front end call
the same `route` / `report` / `finished` / `mark_down` / `mark_up`.
"""

from __future__ import annotations

from collections.abc import Sequence

from heddle.errors import HeddleError
from heddle.router.base import RouterContext, RouterPolicy
from heddle.router.registry import make_router_policy
from heddle.router.state import ReplicaReport, ReplicaState, RouteRequest


class Router:
    def __init__(
        self,
        policy: RouterPolicy | str,
        num_replicas: int,
        *,
        block_size: int = 16,
        seed: int = 0,
        **options: object,
    ) -> None:
        if num_replicas < 1:
            raise HeddleError(f"a router needs at least one replica, got {num_replicas}")
        if isinstance(policy, str):
            policy = make_router_policy(policy, **options)
        elif options:
            raise HeddleError("router options go to the policy's constructor")
        self.policy = policy
        self.replicas = [ReplicaState(i) for i in range(num_replicas)]
        policy.bind(RouterContext(num_replicas=num_replicas, block_size=block_size, seed=seed))
        self.num_routed = [0] * num_replicas
        self.num_unplaced = 0

    @property
    def name(self) -> str:
        return self.policy.name

    def healthy(self) -> list[ReplicaState]:
        return [r for r in self.replicas if r.healthy]

    def route(self, request: RouteRequest, exclude: Sequence[int] = ()) -> int | None:
        """The replica to send `request` to, or None when no healthy replica is left."""
        candidates = [r for r in self.replicas if r.healthy and r.replica_id not in exclude]
        if not candidates:
            self.num_unplaced += 1
            return None
        chosen = self.policy.choose(request, candidates)
        chosen.sent(request.estimated_tokens)
        self.num_routed[chosen.replica_id] += 1
        self.policy.on_routed(request, chosen.replica_id)
        return chosen.replica_id

    def report(self, replica_id: int, report: ReplicaReport) -> None:
        self.replicas[replica_id].apply(report)

    def finished(
        self, request: RouteRequest, replica_id: int, output_token_ids: Sequence[int]
    ) -> None:
        self.policy.on_finished(request, replica_id, output_token_ids)

    def mark_down(self, replica_id: int) -> None:
        replica = self.replicas[replica_id]
        if not replica.healthy:
            return
        replica.healthy = False
        replica.reset()
        self.policy.on_replica_down(replica_id)

    def mark_up(self, replica_id: int) -> None:
        replica = self.replicas[replica_id]
        if replica.healthy:
            return
        replica.reset()
        replica.healthy = True
        self.policy.on_replica_up(replica_id)
