"""`simulate_cluster`: N simulated engines behind a router, on one virtual clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heddle.config import EngineConfig
from heddle.engine.engine import Engine
from heddle.router.replay import ClusterResult, ReplicaFailure, replay_cluster
from heddle.router.router import Router
from heddle.workloads import Workload


def simulate_cluster(
    workload: Workload,
    config: EngineConfig,
    cost_model: Any,
    *,
    num_replicas: int,
    router: str | Router,
    router_options: dict[str, Any] | None = None,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int | None = None,
    failures: Sequence[ReplicaFailure] = (),
    seed: int = 0,
) -> ClusterResult:
    """Every replica is `Engine(config, SimulatedExecutor(cost_model))` with `num_blocks` blocks."""
    from heddle.sim.executor import SimulatedExecutor
    from heddle.sim.simulator import sim_engine
    from heddle.spec.sim import sim_acceptance

    if isinstance(router, str):
        router = Router(
            router,
            num_replicas,
            block_size=config.cache.block_size,
            seed=seed,
            **(router_options or {}),
        )

    def make_engine(replica_id: int) -> Engine:
        acceptance = sim_acceptance(config.scheduler.speculation, seed)
        return sim_engine(
            config,
            lambda clock: SimulatedExecutor(cost_model, clock, vocab_size=vocab_size, seed=seed,
                                            acceptance=acceptance),
            num_blocks=num_blocks,
            vocab_size=vocab_size,
            max_model_len=max_model_len,
            record_steps=False,
        )

    return replay_cluster(
        make_engine, num_replicas, router, workload, vocab_size=vocab_size, failures=failures
    )
