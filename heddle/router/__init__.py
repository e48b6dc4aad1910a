"""Routing requests across engine replicas: policies chosen by name, the same code in the
simulator (N engines on one virtual clock) and in a Ray deployment (heddle.cluster).

Nothing here imports torch or Ray.
"""

from heddle.router.base import RouterContext, RouterPolicy, least_loaded
from heddle.router.registry import available_routers, make_router_policy, register
from heddle.router.router import Router
from heddle.router.state import ReplicaReport, ReplicaState, RouteRequest, token_block_hashes

__all__ = [
    "ReplicaReport",
    "ReplicaState",
    "RouteRequest",
    "Router",
    "RouterContext",
    "RouterPolicy",
    "available_routers",
    "least_loaded",
    "make_router_policy",
    "register",
    "token_block_hashes",
]
