"""The routing-policy interface: given the healthy replicas' state, pick one for a request.

A policy is one small file, chosen by name like the scheduling policies (`make_router_policy`).
It sees `ReplicaState`s (last report + what the router sent since) and the `RouteRequest`, and
may keep its own memory through the hooks (`on_routed`, `on_finished`, `on_replica_down`): a
prefix index, a session's home replica, a round-robin cursor.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from heddle.router.state import ReplicaState, RouteRequest


@dataclass(frozen=True, slots=True)
class RouterContext:
    """Facts about the deployment a policy may need."""

    num_replicas: int
    block_size: int = 16  # the replicas' KV block size (the prefix index's granularity)
    seed: int = 0


class RouterPolicy:
    name = "base"

    def __init__(self, **options: object) -> None:
        if options:
            raise ValueError(f"router {self.name!r} takes no options {sorted(options)}")
        self.context = RouterContext(num_replicas=1)
        self.rng = random.Random(0)

    def bind(self, context: RouterContext) -> None:
        """Called once by the Router before the first request."""
        self.context = context
        self.rng = random.Random(f"{context.seed}:{self.name}")

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        """One of `replicas` (healthy, non-empty, in replica-id order) for `request`."""
        raise NotImplementedError

    # -- hooks ------------------------------------------------------------------------------
    def on_routed(self, request: RouteRequest, replica_id: int) -> None:
        """`request` was sent to `replica_id`."""

    def on_finished(
        self, request: RouteRequest, replica_id: int, output_token_ids: Sequence[int]
    ) -> None:
        """`request` finished on `replica_id` with these output tokens (its KV may be cached)."""

    def on_replica_down(self, replica_id: int) -> None:
        """The replica died or was removed: whatever it cached is gone."""

    def on_replica_up(self, replica_id: int) -> None:
        """The replica (re)joined with an empty cache."""


def least_loaded(replicas: Sequence[ReplicaState]) -> ReplicaState:
    """Fewest outstanding tokens; ties: fewest requests, then lowest id."""
    return min(replicas, key=lambda r: (r.outstanding_tokens, r.num_requests, r.replica_id))
