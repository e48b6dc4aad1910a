"""In-process replicas for the front end's unit tests: the real EngineReplica body over the
model-free fake engine (tests/server/fakes.py), called directly instead of through Ray, with a
kill switch that breaks every stream the way a dead actor does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from heddle.cluster.chunks import ReplicaChunk
from heddle.cluster.frontend import ClusterEngine, ReplicaLost
from heddle.cluster.replica import EngineReplica
from heddle.request import SamplingParams
from heddle.router import Router
from heddle.router.state import ReplicaReport
from tests.server.fakes import CharTokenizer, make_engine


class LocalReplica:
    """A ReplicaClient over an in-process EngineReplica; `kill()` makes it a dead actor."""

    def __init__(self, replica_id: int, step_time: float = 0.002) -> None:
        self.replica_id = replica_id
        self.step_time = step_time
        self.body = self._start()
        self.dead = False
        self.killed = asyncio.Event()
        self.requests: list[str] = []

    def _start(self) -> EngineReplica:
        return EngineReplica(
            self.replica_id,
            lambda: (make_engine(step_time=self.step_time), CharTokenizer(), "fake-model"),
        )

    def kill(self) -> None:
        self.dead = True
        self.killed.set()
        self.body.shutdown()

    def restart(self) -> None:
        self.body = self._start()
        self.dead = False
        self.killed = asyncio.Event()

    async def generate(
        self, request_id: str, prompt: list[int], params: SamplingParams, hints: dict[str, Any]
    ) -> AsyncIterator[ReplicaChunk]:
        if self.dead:
            raise ReplicaLost("dead")
        self.requests.append(request_id)
        source = self.body.generate(request_id, prompt, params, hints)
        killed = self.killed
        while True:
            step = asyncio.ensure_future(anext(source))
            kill = asyncio.ensure_future(killed.wait())
            done, _ = await asyncio.wait({step, kill}, return_when=asyncio.FIRST_COMPLETED)
            if kill in done:
                step.cancel()
                raise ReplicaLost("killed")
            kill.cancel()
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk

    async def abort(self, request_id: str) -> None:
        if not self.dead:
            self.body.abort(request_id)

    async def report(self) -> ReplicaReport:
        if self.dead:
            raise ReplicaLost("dead")
        return self.body.report()

    def idle(self) -> bool:
        state = self.body.kv_state()
        return state == {"unfinished": 0, "kv_blocks_used": 0}


def local_cluster(
    n: int = 2, router: str = "least-tokens", step_time: float = 0.002, **options: Any
) -> tuple[ClusterEngine, list[LocalReplica]]:
    replicas = [LocalReplica(i, step_time) for i in range(n)]
    engine = ClusterEngine(
        list(replicas),
        Router(router, n, block_size=4),
        tokenizer=CharTokenizer(),
        model_name="fake-model",
        max_model_len=256,
        health_interval=0.05,
        **options,
    )
    return engine, replicas
