"""ray-prefix: Ray Serve LLM's PrefixCacheAffinityRouter rule, as a baseline.

Its rule (ray.llm's PrefixAwarePow2ReplicaRouter, with its defaults):
1. If the replicas' queue lengths differ by more than `imbalanced_threshold` (10 requests),
   route by power of two choices.
2. Otherwise match the prompt against a prefix tree of the prompts sent to each replica. If the
   best match covers at least `match_rate_threshold` (10%) of the prompt, the candidates are the
   replicas with that longest match; else the replicas with the fewest entries in the tree
   ("smallest tenants").
3. Of the candidates, the one with the shortest queue.
Only prompts are inserted (not outputs), at routing time, and the tree is not evicted (its
default `do_eviction=False`). Ray's tree is over characters; here it is over the engine's token
blocks (the granularity a prefix cache can hit at).
"""

from __future__ import annotations

from collections.abc import Sequence

from heddle.router.base import RouterPolicy
from heddle.router.policies.pow2 import pick_two
from heddle.router.prefix_index import PrefixIndex
from heddle.router.registry import register
from heddle.router.state import ReplicaState, RouteRequest


@register
class RayPrefixAffinity(RouterPolicy):
    """Ray Serve LLM's prefix-cache-affinity rule (queue balance check, prefix tree of prompts,
    10% match threshold, smallest tenant, power of two choices) as a baseline."""

    name = "ray-prefix"

    def __init__(self, imbalanced_threshold: int = 10, match_rate_threshold: float = 0.1) -> None:
        super().__init__()
        if imbalanced_threshold < 0 or not 0 <= match_rate_threshold <= 1:
            raise ValueError("need imbalanced_threshold >= 0 and match_rate_threshold in [0, 1]")
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.index = PrefixIndex(None)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        if len(replicas) == 1:
            return replicas[0]
        queues = [r.num_requests for r in replicas]
        if max(queues) - min(queues) > self.imbalanced_threshold:
            return pick_two(self.rng.sample(list(replicas), 2))
        bs = self.context.block_size
        hits = self.index.match(request.block_hashes(bs), (r.replica_id for r in replicas))
        longest = max(hits.values(), default=0)
        if request.num_prompt_tokens and longest * bs / request.num_prompt_tokens >= (
            self.match_rate_threshold
        ):
            candidates = [r for r in replicas if hits.get(r.replica_id, 0) == longest]
        else:
            fewest = min(self.index.num_blocks(r.replica_id) for r in replicas)
            candidates = [r for r in replicas if self.index.num_blocks(r.replica_id) == fewest]
        shortest = min(r.num_requests for r in candidates)
        return self.rng.choice([r for r in candidates if r.num_requests == shortest])

    def on_routed(self, request: RouteRequest, replica_id: int) -> None:
        self.index.insert(replica_id, request.block_hashes(self.context.block_size))

    def on_replica_down(self, replica_id: int) -> None:
        self.index.remove_replica(replica_id)
