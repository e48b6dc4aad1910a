"""`heddle serve --replicas N`: Ray replicas behind the one OpenAI-compatible front end."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import replace
from typing import Any

from heddle.cluster.frontend import ClusterEngine
from heddle.cluster.ray_runtime import RayCluster
from heddle.cluster.replica import EngineFactory, model_engine_factory
from heddle.config import EngineConfig
from heddle.errors import HeddleError
from heddle.router.router import Router

logger = logging.getLogger(__name__)


def threads_per_replica(config: EngineConfig, num_replicas: int) -> int:
    """Each replica's torch threads: --num-threads, or the machine's cores shared out."""
    if config.model.num_threads:
        return config.model.num_threads
    return max(1, (os.cpu_count() or 1) // num_replicas)


def start_cluster(
    config: EngineConfig,
    num_replicas: int,
    *,
    router: str = "affinity",
    router_options: dict[str, Any] | None = None,
    ray_address: str | None = None,
    max_model_len: int | None = None,
    factories: list[EngineFactory] | None = None,
    max_restarts: int = 3,
    **frontend_options: Any,
) -> tuple[ClusterEngine, RayCluster]:
    """Start (or join) Ray, place the replicas, wait until each has loaded its model."""
    from heddle.cluster.ray_client import RayReplicaClient

    if num_replicas < 1:
        raise HeddleError("--replicas must be at least 1")
    threads = threads_per_replica(config, num_replicas)
    replica_config = replace(config, model=replace(config.model, num_threads=threads))
    if factories is None:
        factories = [model_engine_factory(replica_config, max_model_len)] * num_replicas
    cluster = RayCluster(
        factories, cpus_per_replica=threads, ray_address=ray_address, max_restarts=max_restarts
    )
    infos = cluster.wait_ready()
    try:
        tokenizer = cluster.get_tokenizer()
        router_obj = Router(
            router,
            num_replicas,
            block_size=infos[0].block_size,
            seed=config.seed,
            **(router_options or {}),
        )
    except BaseException:
        cluster.stop()
        raise
    engine = ClusterEngine(
        [RayReplicaClient(actor) for actor in cluster.actors],
        router_obj,
        tokenizer=tokenizer,
        model_name=infos[0].model_name,
        max_model_len=infos[0].max_model_len,
        on_stop=cluster.stop,
        **frontend_options,
    )
    logger.info(
        "%d replicas up (%d threads each, pids %s), router %s",
        num_replicas,
        threads,
        [i.pid for i in infos],
        router,
    )
    return engine, cluster


def run_cluster_server(
    config: EngineConfig,
    num_replicas: int,
    *,
    host: str,
    port: int,
    ray_address: str | None = None,
    router: str = "affinity",
    router_options: dict[str, Any] | None = None,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_body_bytes: int,
    shutdown_timeout: float = 10.0,
    log_level: str = "info",
) -> int:
    """Serve until SIGTERM/SIGINT like run_server, then stop the replicas (and a local Ray)."""
    import uvicorn

    from heddle.server.app import _DrainingServer, _signals_end_gracefully, build_app

    engine, _ = start_cluster(
        config,
        num_replicas,
        router=router,
        router_options=router_options,
        ray_address=ray_address,
    )
    try:
        aliases = [config.model.model] if config.model.model else []
        app = build_app(
            engine,
            tokenizer=engine.tokenizer,
            model_name=served_model_name,
            aliases=aliases,
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout,
        )
        uvicorn_config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=math.ceil(shutdown_timeout) + 5,
            lifespan="on",
        )
        server = _DrainingServer(uvicorn_config, engine, shutdown_timeout)
        with _signals_end_gracefully():
            server.run()
    finally:
        engine.shutdown(shutdown_timeout)
    return 0
