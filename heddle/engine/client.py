"""What the server needs of an engine: an `EngineClient`, wherever the engine runs.

Two implementations: `AsyncEngine` (the engine loop in a thread of this process; tests and
`--engine-core thread`) and `CoreClient` (the engine core in its own process, the default of
`heddle serve`). Several cores behind one front end (replicas) are more clients of this shape.
"""

from __future__ import annotations

from typing import Any, Protocol

from heddle.engine.async_engine import EngineStats, RequestStream, StepListener
from heddle.request import SamplingParams


class EngineClient(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int | None: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def stats(self) -> EngineStats: ...

    @property
    def error(self) -> BaseException | None:
        """Why the engine cannot serve now (None while it can)."""
        ...

    async def start_async(self) -> None: ...

    async def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, **kwargs: Any
    ) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def abort_all(self) -> None: ...

    def add_listener(self, listener: StepListener) -> None: ...

    def shutdown(self, timeout: float | None = 10.0) -> None: ...

    async def shutdown_async(self, timeout: float | None = 10.0) -> None: ...
