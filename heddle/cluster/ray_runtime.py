"""Starting (or joining) Ray and placing engine replicas on it as actors.

Why actors and not Ray Serve deployments: a Serve deployment brings its own HTTP proxy, its own
router (power of two choices or its prefix router) and its own request retries, which are the
three things heddle wants to own: the front end here is heddle's OpenAI server, the router is
heddle.router (the same code the simulator runs), and failover must resume at the exact token
rather than retry from scratch. What heddle needs from Ray is what actors give: a process per
replica with its own CPU/GPU budget, placement on a cluster, restarts (`max_restarts`) and a
streaming call (an async generator method) whose death surfaces as an exception.

A local Ray is started on 127.0.0.1 with no dashboard and a small object store; `ray_address`
joins an existing cluster instead. `RayCluster.stop()` kills the replicas and, if it started
Ray, shuts it down, so nothing is left running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from heddle.cluster.replica import EngineFactory, EngineReplica
from heddle.errors import HeddleError

logger = logging.getLogger(__name__)

OBJECT_STORE_BYTES = 256 * 1024 * 1024
_LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-node, loopback mode


class RayCluster:
    """Ray (started here or joined) and the replica actors placed on it."""

    def __init__(
        self,
        factories: Sequence[EngineFactory],
        *,
        cpus_per_replica: float = 1.0,
        ray_address: str | None = None,
        max_restarts: int = 3,
    ) -> None:
        if ray_address is None:
            # Ray's single-machine mode: every Ray process (GCS, raylet, workers) binds and
            # connects on 127.0.0.1 only, instead of the address of the default route. Set
            # before Ray is imported (it reads it once) and inherited by its processes.
            os.environ[_LOOPBACK_ONLY] = "0"
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            import ray
            import ray._private.ray_constants as ray_constants
        except ImportError as e:  # pragma: no cover - ray is a dependency
            raise HeddleError("--replicas needs Ray: pip install 'ray==2.60.0'") from e
        if ray_address is None:
            ray_constants.ENABLE_RAY_CLUSTER = False  # in case Ray was imported before
        self._ray = ray
        self.started_ray = False
        if not ray.is_initialized():
            if ray_address is None:
                ray.init(
                    address="local",
                    num_cpus=max(1, round(cpus_per_replica * len(factories))),
                    num_gpus=0,
                    include_dashboard=False,
                    object_store_memory=OBJECT_STORE_BYTES,
                    log_to_driver=False,
                    configure_logging=False,
                )
            else:
                try:
                    ray.init(address=ray_address, log_to_driver=False, configure_logging=False)
                except Exception as e:
                    raise HeddleError(f"cannot join the Ray cluster at {ray_address}: {e}") from e
            self.started_ray = True
        actor_class = ray.remote(EngineReplica)
        self.actors: list[Any] = [
            actor_class.options(
                num_cpus=cpus_per_replica,
                max_restarts=max_restarts,
                max_task_retries=0,  # the front end resumes requests itself
                max_concurrency=1000,
            ).remote(i, factory)
            for i, factory in enumerate(factories)
        ]

    def wait_ready(self, timeout: float = 300.0) -> list[Any]:
        """Each replica's ReplicaInfo once its model is loaded."""
        try:
            return list(self._ray.get([a.info.remote() for a in self.actors], timeout=timeout))
        except Exception as e:
            self.stop()
            raise HeddleError(f"the replicas did not start: {e}") from e

    def get_tokenizer(self) -> Any:
        return self._ray.get(self.actors[0].get_tokenizer.remote())

    def kill(self, replica_id: int, no_restart: bool = False) -> None:
        self._ray.kill(self.actors[replica_id], no_restart=no_restart)

    def stop(self) -> None:
        ray = self._ray
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                logger.debug("replica already gone", exc_info=True)
        self.actors = []
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False
