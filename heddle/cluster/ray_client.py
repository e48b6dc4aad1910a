"""ReplicaClient over a Ray actor handle: a streaming actor call per request."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from heddle.cluster.chunks import ReplicaChunk
from heddle.cluster.frontend import ReplicaLost
from heddle.request import SamplingParams
from heddle.router.state import ReplicaReport


class RayReplicaClient:
    def __init__(self, actor: Any) -> None:
        import ray.exceptions

        self.actor = actor
        self._lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorUnavailableError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.RaySystemError,
        )

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        hints: dict[str, Any],
    ) -> AsyncIterator[ReplicaChunk]:
        try:
            refs = self.actor.generate.remote(request_id, prompt_token_ids, params, hints)
            async for ref in refs:
                yield await ref
        except self._lost as e:
            raise ReplicaLost(str(e).splitlines()[0] if str(e) else type(e).__name__) from e

    async def abort(self, request_id: str) -> None:
        with contextlib.suppress(*self._lost):
            await self.actor.abort.remote(request_id)

    async def report(self) -> ReplicaReport:
        try:
            report: ReplicaReport = await self.actor.report.remote()
        except self._lost as e:
            raise ReplicaLost(type(e).__name__) from e
        return report
