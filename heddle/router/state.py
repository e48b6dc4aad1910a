"""What the router knows: each replica's reported state, and the request it is placing.

Replicas publish a `ReplicaReport` after their steps (the simulator after every step, a Ray
replica on every batch of outputs it streams back, plus a periodic health probe when idle), so
routing never costs a round-trip per request. Between two reports the router counts what it has
sent itself (`ReplicaState.pending`), so a burst of arrivals does not pile onto the replica that
looked idlest in the last report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from heddle.core import block_hash
from heddle.core.block_hash import BlockHash


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A replica's state as it publishes it (plain numbers: it crosses a process boundary)."""

    num_running: int = 0
    num_waiting: int = 0
    # Tokens still to compute or generate for every request on the replica:
    # uncomputed prompt tokens + (max output tokens - output tokens so far).
    outstanding_tokens: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    # How many requests the replica has received in all: the router drops its own count of
    # requests sent since the previous report up to this watermark.
    num_received: int = 0
    # Sessions whose KV the replica keeps parked (agent sessions paused on a tool call).
    parked_sessions: frozenset[str] = frozenset()
    time: float = 0.0
    # For /metrics only (the policies do not read them).
    prefix_hit_rate: float = 0.0
    num_preemptions: int = 0
    num_steps: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclass(slots=True)
class ReplicaState:
    """The router's view of one replica: its last report plus what was sent since."""

    replica_id: int
    healthy: bool = True
    report: ReplicaReport = field(default_factory=ReplicaReport)
    # (sequence number of the send, estimated tokens) of requests sent after `report` was made.
    pending: list[tuple[int, int]] = field(default_factory=list)
    num_sent: int = 0

    @property
    def num_requests(self) -> int:
        """Requests on the replica (running + waiting), counting those sent since the report."""
        return self.report.num_running + self.report.num_waiting + len(self.pending)

    @property
    def outstanding_tokens(self) -> int:
        return self.report.outstanding_tokens + sum(tokens for _, tokens in self.pending)

    @property
    def kv_usage(self) -> float:
        return self.report.kv_usage

    def apply(self, report: ReplicaReport) -> None:
        self.report = report
        self.pending = [(seq, tokens) for seq, tokens in self.pending if seq > report.num_received]

    def sent(self, tokens: int) -> None:
        self.num_sent += 1
        self.pending.append((self.num_sent, tokens))

    def reset(self) -> None:
        """A restarted replica: nothing on it, nothing sent to it yet."""
        self.report = ReplicaReport(kv_blocks_total=self.report.kv_blocks_total)
        self.pending = []
        self.num_sent = 0


@dataclass(slots=True)
class RouteRequest:
    """A request as the router sees it (built by the front end or the simulator)."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    request_class: str = "default"
    priority: int = 0
    # The conversation or agent session this request continues (None: route by prefix only).
    session_id: str | None = None
    _block_hashes: list[BlockHash] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def estimated_tokens(self) -> int:
        """Work the request brings to a replica, before any cache hit."""
        return self.num_prompt_tokens + self.max_tokens

    def block_hashes(self, block_size: int) -> list[BlockHash]:
        """Chained hashes of the prompt's full blocks, as the replicas' prefix caches key them."""
        if self._block_hashes is None:
            self._block_hashes = token_block_hashes(self.prompt_token_ids, block_size)
        return self._block_hashes


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The chain of block hashes of `token_ids`' full blocks (the engine's own chained SHA-256,
    without namespace or salt: the router compares its own hashes only)."""
    return block_hash.block_hashes(token_ids, block_size)
