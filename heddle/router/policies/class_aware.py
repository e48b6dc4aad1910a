"""class-aware: isolation lanes across replicas.

Bulk traffic (a class in `bulk_classes`, at least `long_prompt_tokens` of prompt to compute
after the longest cached prefix any replica holds, or a priority at or above `bulk_priority`)
goes only to the bulk replicas, the last `round(bulk_share * N)` (at least 1, at most N - 1).
So a long prefill never shares a step with a latency-critical decode. Latency traffic stays on
the other replicas, except that it may use a bulk replica whose outstanding tokens are below
`spill_ratio` times the least-loaded latency replica's (reserved replicas do not idle when no
bulk traffic comes). Within its lane a request is placed by the `inner` policy (affinity by
default). A lane with no healthy replica spills onto the other lane rather than fail.
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
        spill_ratio: float = 0.5,
        inner: str = "affinity",
        inner_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not 0 < bulk_share < 1:
            raise ValueError("bulk_share must be in (0, 1)")
        if spill_ratio < 0:
            raise ValueError("spill_ratio must be >= 0")
        if inner == self.name:
            raise ValueError("class-aware cannot be its own inner policy")
        self.bulk_classes = frozenset(bulk_classes)
        self.long_prompt_tokens = long_prompt_tokens
        self.bulk_priority = bulk_priority
        self.bulk_share = bulk_share
        self.spill_ratio = spill_ratio
        self.inner = make_router_policy(inner, **(inner_options or {}))
        self.bulk_replicas: frozenset[int] = frozenset()

    def bind(self, context: RouterContext) -> None:
        super().bind(context)
        self.inner.bind(context)
        n = context.num_replicas
        num_bulk = min(n - 1, max(1, round(self.bulk_share * n))) if n > 1 else 0
        self.bulk_replicas = frozenset(range(n - num_bulk, n))

    def is_bulk(self, request: RouteRequest, replicas: Sequence[ReplicaState] = ()) -> bool:
        if request.request_class in self.bulk_classes:
            return True
        if self.bulk_priority is not None and request.priority >= self.bulk_priority:
            return True
        if self.long_prompt_tokens is None:
            return False
        uncached = request.num_prompt_tokens
        index = getattr(self.inner, "index", None)
        if index is not None and uncached >= self.long_prompt_tokens:
            bs = self.context.block_size
            hits = index.match(request.block_hashes(bs), (r.replica_id for r in replicas))
            uncached -= bs * max(hits.values(), default=0)
        return uncached >= self.long_prompt_tokens

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        bulk_lane = [r for r in replicas if r.replica_id in self.bulk_replicas]
        latency_lane = [r for r in replicas if r.replica_id not in self.bulk_replicas]
        if self.is_bulk(request, replicas):
            return self.inner.choose(request, bulk_lane or latency_lane)
        if not latency_lane:
            return self.inner.choose(request, bulk_lane)
        floor = min(r.outstanding_tokens for r in latency_lane)
        idle_bulk = [r for r in bulk_lane if r.outstanding_tokens < self.spill_ratio * floor]
        return self.inner.choose(request, latency_lane + idle_bulk)

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
