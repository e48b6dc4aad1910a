"""What crosses the process boundary between a replica and the front end: plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

from heddle.core.outputs import TokenLogprobs
from heddle.router.state import ReplicaReport


@dataclass(slots=True)
class ReplicaInfo:
    """What a replica tells the front end once it is up."""

    replica_id: int
    model_name: str
    max_model_len: int | None
    vocab_size: int | None
    eos_token_id: int | None
    num_blocks: int
    block_size: int
    pid: int


@dataclass(slots=True)
class ReplicaChunk:
    """New output tokens of one request (or its refusal), with the replica's state piggybacked
    so the router stays fresh without asking."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    report: ReplicaReport | None = None
    # The engine refused the request: (error class name, message, param).
    error: tuple[str, str, str | None] | None = None
