"""affinity: send a session's next turn, or a request sharing a long prefix, to the replica that
holds its KV, unless that replica is overloaded by a stated margin.

Each replica costs `outstanding tokens + prompt tokens it would have to compute` (a cache hit
saves prefill). The *home* of a request is its session's last replica, or else the replica
holding the longest cached prefix of it (at least `min_prefix_tokens`). The request goes home
unless

    cost(home) > cost(best) * (1 + margin_ratio) + margin_tokens      or
    kv_usage(home) >= max_kv_usage (while the best replica is below it),

where best is the cheapest replica; then it goes to best (and best becomes the session's home).
The router learns what each replica caches from what it sent there (prompt, then prompt + output
when the request finishes), bounded per replica by its KV capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from heddle.router.base import RouterPolicy
from heddle.router.prefix_index import PrefixIndex
from heddle.router.registry import register
from heddle.router.state import ReplicaState, RouteRequest, token_block_hashes

MAX_SESSIONS = 100_000  # session homes remembered (least recently used forgotten first)


@register
class Affinity(RouterPolicy):
    """Session / prefix affinity: a request goes where its KV is, unless that replica is
    overloaded by more than a stated margin."""

    name = "affinity"

    def __init__(
        self,
        margin_tokens: int = 4096,
        margin_ratio: float = 0.25,
        min_prefix_tokens: int = 256,
        max_kv_usage: float = 0.95,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__()
        if margin_tokens < 0 or margin_ratio < 0 or min_prefix_tokens < 0:
            raise ValueError("margins and min_prefix_tokens must be >= 0")
        if not 0 < max_kv_usage <= 1:
            raise ValueError("max_kv_usage must be in (0, 1]")
        self.margin_tokens = margin_tokens
        self.margin_ratio = margin_ratio
        self.min_prefix_tokens = min_prefix_tokens
        self.max_kv_usage = max_kv_usage
        self._capacity = capacity_blocks
        self.index = PrefixIndex(capacity_blocks)
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self.num_home = 0  # decisions that went home
        self.num_moved = 0  # decisions that left an overloaded home

    def _fit_capacity(self, replicas: Sequence[ReplicaState]) -> None:
        """Bound the index by the replicas' KV size once they have reported it."""
        if self._capacity is None and self.index.capacity_blocks is None:
            total = max((r.report.kv_blocks_total for r in replicas), default=0)
            if total:
                self.index.capacity_blocks = total

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> ReplicaState:
        self._fit_capacity(replicas)
        bs = self.context.block_size
        hits = self.index.match(request.block_hashes(bs), (r.replica_id for r in replicas))
        prompt = request.num_prompt_tokens

        def cost(r: ReplicaState) -> int:
            return r.outstanding_tokens + prompt - bs * hits.get(r.replica_id, 0)

        best = min(replicas, key=lambda r: (cost(r), r.num_requests, r.replica_id))
        home = self._home(request, replicas, hits)
        if home is None or home is best:
            if home is best:
                self.num_home += 1
            return best
        overloaded = cost(home) > cost(best) * (1 + self.margin_ratio) + self.margin_tokens
        full = home.kv_usage >= self.max_kv_usage > best.kv_usage
        if overloaded or full:
            self.num_moved += 1
            return best
        self.num_home += 1
        return home

    def _home(
        self, request: RouteRequest, replicas: Sequence[ReplicaState], hits: dict[int, int]
    ) -> ReplicaState | None:
        by_id = {r.replica_id: r for r in replicas}
        if request.session_id is not None:
            home_id = self.sessions.get(request.session_id)
            if home_id is not None and home_id in by_id:
                return by_id[home_id]
        if not hits:
            return None
        home_id, blocks = max(hits.items(), key=lambda item: (item[1], -item[0]))
        if blocks * self.context.block_size < self.min_prefix_tokens:
            return None
        return by_id[home_id]

    def on_routed(self, request: RouteRequest, replica_id: int) -> None:
        self.index.insert(replica_id, request.block_hashes(self.context.block_size))
        if request.session_id is not None:
            self.sessions[request.session_id] = replica_id
            self.sessions.move_to_end(request.session_id)
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)

    def on_finished(
        self, request: RouteRequest, replica_id: int, output_token_ids: Sequence[int]
    ) -> None:
        # The engine caches the output's full blocks too: the next turn's prompt starts with them.
        tokens = [*request.prompt_token_ids, *output_token_ids]
        self.index.insert(replica_id, token_block_hashes(tokens, self.context.block_size))

    def on_replica_down(self, replica_id: int) -> None:
        self.index.remove_replica(replica_id)
        for session in [s for s, r in self.sessions.items() if r == replica_id]:
            del self.sessions[session]
