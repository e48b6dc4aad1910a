"""One engine replica: the body of a Ray actor (heddle.cluster.ray_runtime makes it remote).

The actor hosts an Engine run by an AsyncEngine (the engine loop in its own thread) and streams
token ids only: the front end does tokenization, detokenization and stop strings, so a request
can move to another replica mid-stream without the text going wrong.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from heddle.cluster.chunks import ReplicaChunk, ReplicaInfo
from heddle.config import EngineConfig
from heddle.engine.async_engine import AsyncEngine
from heddle.engine.engine import Engine
from heddle.errors import HeddleError
from heddle.request import SamplingParams
from heddle.router.state import ReplicaReport

EngineFactory = Callable[[], tuple[Engine, Any, str]]  # -> (engine, tokenizer, model name)


def model_engine_factory(config: EngineConfig, max_model_len: int | None = None) -> EngineFactory:
    """Builds the real engine over `config.model` (torch is imported in the replica only)."""

    def build() -> tuple[Engine, Any, str]:
        from heddle.model.executor import ModelExecutor
        from heddle.spec.draft import attach_draft_model

        executor = ModelExecutor(config.model, config.cache)
        attach_draft_model(executor, config.scheduler.speculation, config.model)
        limit = executor.max_model_len
        if max_model_len is not None:
            limit = min(limit, max_model_len)
        engine = Engine(
            config,
            executor,
            num_blocks=executor.num_blocks,
            tokenizer=None,  # the front end detokenizes
            eos_token_id=executor.eos_token_id,
            max_model_len=limit,
            vocab_size=executor.model_shape.vocab_size,
        )
        return engine, executor.tokenizer, executor.model_name

    return build


@dataclass(slots=True)
class _Flight:
    prompt_pending: int  # prompt tokens counted as outstanding until the first token
    output_left: int


class EngineReplica:
    def __init__(self, replica_id: int, factory: EngineFactory) -> None:
        self.replica_id = replica_id
        engine, self.tokenizer, self.model_name = factory()
        self.engine = engine
        self.async_engine = AsyncEngine(engine)
        self.async_engine.start()
        self.num_received = 0
        self._flights: dict[str, _Flight] = {}

    def info(self) -> ReplicaInfo:
        engine = self.engine
        return ReplicaInfo(
            replica_id=self.replica_id,
            model_name=self.model_name,
            max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size,
            eos_token_id=engine.eos_token_id,
            num_blocks=engine.kv_cache.num_blocks,
            block_size=engine.kv_cache.block_size,
            pid=os.getpid(),
        )

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def report(self) -> ReplicaReport:
        stats = self.async_engine.stats
        if not self.async_engine.is_running and self.async_engine.error is not None:
            raise HeddleError(f"the engine loop died: {self.async_engine.error!r}")
        return ReplicaReport(
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            outstanding_tokens=sum(
                f.prompt_pending + f.output_left for f in self._flights.values()
            ),
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_total=stats.kv_blocks_used + stats.kv_blocks_free,
            num_received=self.num_received,
            prefix_hit_rate=stats.prefix_cache_hit_rate,
            num_preemptions=stats.num_preemptions_total,
            num_steps=stats.num_steps,
        )

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        hints: dict[str, Any],
    ) -> AsyncIterator[ReplicaChunk]:
        """Add the request; yield an empty chunk once accepted, then its tokens as they come."""
        self.num_received += 1
        try:
            stream = await self.async_engine.add_request(
                request_id, prompt_token_ids, params, **hints
            )
        except HeddleError as e:
            yield ReplicaChunk(error=(type(e).__name__, str(e), getattr(e, "param", None)))
            return
        limit = self.engine.max_model_len
        output_left = params.max_tokens
        if output_left is None:
            output_left = (limit or len(prompt_token_ids) + 1) - len(prompt_token_ids)
        flight = _Flight(len(prompt_token_ids), output_left)
        self._flights[request_id] = flight
        sent_logprobs = 0
        try:
            yield ReplicaChunk(report=self.report())
            async for output in stream:
                completion = output.outputs[0]
                if completion.delta_token_ids:
                    flight.prompt_pending = 0
                    flight.output_left -= len(completion.delta_token_ids)
                logprobs = None
                if completion.logprobs is not None:
                    logprobs = completion.logprobs[sent_logprobs:]
                    sent_logprobs = len(completion.logprobs)
                if output.finished:
                    del self._flights[request_id]
                yield ReplicaChunk(
                    token_ids=list(completion.delta_token_ids),
                    logprobs=logprobs,
                    finish_reason=completion.finish_reason,
                    stop_reason=completion.stop_reason,
                    num_cached_tokens=output.num_cached_tokens,
                    report=self.report(),
                )
        finally:
            if self._flights.pop(request_id, None) is not None:
                self.async_engine.abort(request_id)

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    def pid(self) -> int:
        return os.getpid()

    def kv_state(self) -> dict[str, int]:
        """For tests: unfinished requests and KV blocks in use (0 and 0 when idle)."""
        return {
            "unfinished": self.async_engine.stats.num_running + self.async_engine.stats.num_waiting,
            "kv_blocks_used": self.async_engine.stats.kv_blocks_used,
        }

    def shutdown(self) -> None:
        self.async_engine.shutdown()
