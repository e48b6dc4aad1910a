"""class-aware: isolation lanes across replicas.

Bulk traffic (a class in `bulk_classes`, a prompt of at least `long_prompt_tokens`, or a
priority at or above `bulk_priority`) goes only to the bulk replicas, the last
`round(bulk_share * N)` (at least 1, at most N - 1); everything else, the latency-critical
classes, only to the others. So a long prompt's prefill never shares a step with a chat's
decode. Within its lane a request is placed by the `inner` policy (affinity by default). A lane
with no healthy replica spills onto the other lane rather than fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heddle.router.base import RouterContext, RouterPolicy
from heddle.router.registry import make_router_policy, register
from heddle.router.state import ReplicaState, RouteRequest

DEFAULT_BULK_CLASSES = ("long", "batch", "reasoning", "bulk")


@register
class ClassAware(RouterPolicy):
    """Isolation lanes across replicas: long-context / bulk / low-priority traffic kept off the
    replicas that serve the latency-critical classes."""

    name = "class-aware"

    def __init__(
        self,
        bulk_classes: Sequence[str] = DEFAULT_BULK_CLASSES,
        long_prompt_tokens: int | None = 2048,
        bulk_priority: int | None = None,
        bulk_share: float = 0.25,
        inner: str = "affinity",
        inner_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not 0 < bulk_share < 1:
            raise ValueError("bulk_share must be in (0, 1)")
        if inner == self.name:
            raise ValueError("class-aware cannot be its own inner policy")
        self.bulk_classes = frozenset(bulk_classes)
        self.long_prompt_tokens = long_prompt_tokens
        self.bulk_priority = bulk_priority
        self.bulk_share = bulk_share
        self.inner = make_router_policy(inner, **(inner_options or {}))
        self.bulk_replicas: frozenset[int] = frozenset()

    def bind(self, context: RouterContext) -> None:
        super().bind(context)
        self.inner.bind(context)
        n = context.num_replicas
        num_bulk = min(n - 1, max(1, round(self.bulk_share * n))) if n > 1 else 0
        self.bulk_replicas = frozenset(range(n - num_bulk, n))

    def is_bulk(self, request: RouteRequest) -> bool:
        if request.request_class in self.bulk_classes:
            return True
        if self.long_prompt_tokens is not None and (
            request.num_prompt_tokens >= self.long_prompt_tokens
        ):
            return True
        return self.bulk_priority is not None and request.priority >= self.bulk_priority

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        bulk = self.is_bulk(request)
        lane = [r for r in replicas if (r.replica_id in self.bulk_replicas) == bulk]
        return self.inner.choose(request, lane or replicas)

    def on_routed(self, request: RouteRequest, replica_id: int) -> None:
        self.inner.on_routed(request, replica_id)

    def on_finished(
        self, request: RouteRequest, replica_id: int, output_token_ids: Sequence[int]
    ) -> None:
        self.inner.on_finished(request, replica_id, output_token_ids)

    def on_replica_down(self, replica_id: int) -> None:
        self.inner.on_replica_down(replica_id)

    def on_replica_up(self, replica_id: int) -> None:
        self.inner.on_replica_up(replica_id)
