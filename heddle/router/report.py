"""A replica's report, read off its Engine (the simulator and the Ray replica both use this)."""

from __future__ import annotations

from typing import Any

from heddle.router.state import ReplicaReport


def engine_report(engine: Any, num_received: int, now: float) -> ReplicaReport:
    """What the router needs of an `Engine`: queue, outstanding tokens and KV use."""
    scheduler = engine.scheduler
    kv = engine.kv_cache
    outstanding = 0
    for request in scheduler.requests.values():
        outstanding += (
            request.num_uncomputed_tokens + request.max_output_tokens - request.num_output_tokens
        )
    return ReplicaReport(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        outstanding_tokens=outstanding,
        kv_blocks_used=kv.num_used_blocks,
        kv_blocks_total=kv.num_blocks,
        num_received=num_received,
        time=now,
    )
