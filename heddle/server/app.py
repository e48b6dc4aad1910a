"""Build the FastAPI app over an engine client, and serve it with uvicorn.

`build_app(engine_client)` is the ASGI app (tests run it in a thread). `run_server(config)`
starts the engine core in its own process (it loads the model), serves until SIGTERM/SIGINT,
then stops accepting connections, lets in-flight requests finish for up to `shutdown_timeout`
seconds, aborts the rest, stops the core and returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, cast

import uvicorn
from fastapi import FastAPI

from heddle.config import EngineConfig
from heddle.engine.async_engine import AsyncEngine
from heddle.engine.client import EngineClient
from heddle.engine.core_client import CoreClient
from heddle.engine.core_process import engine_from_config
from heddle.engine.cpus import available_cpus, plan_cpus
from heddle.engine.engine import Engine
from heddle.errors import HeddleError
from heddle.server.errors import install_error_handlers
from heddle.server.metrics import ServerMetrics
from heddle.server.middleware import DEFAULT_MAX_BODY_BYTES, APIKeyMiddleware, BodyLimitMiddleware
from heddle.server.routes import router
from heddle.server.state import ServerState, ServerTokenizer
from heddle.tools import make_format
from heddle.view.live import install_dashboard, view_source

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def build_app(
    async_engine: EngineClient,
    *,
    tokenizer: ServerTokenizer | None = None,
    model_name: str | None = None,
    aliases: Sequence[str] = (),
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_engine: bool = True,
    shutdown_timeout: float = 10.0,
    tool_call_parser: str = "auto",
) -> FastAPI:
    """The OpenAI-compatible app over an engine client (an AsyncEngine in this process, or a
    CoreClient whose engine core runs in its own process). The client is attached to the app's
    event loop when the app starts; with `shutdown_engine`, it is shut down (in-flight requests
    aborted) when the app stops."""
    tokenizer = tokenizer or cast(ServerTokenizer | None, async_engine.tokenizer)
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise HeddleError("the server needs a tokenizer with encode() and apply_chat_template()")
    name = model_name or async_engine.model_name
    if tool_call_parser != "auto":
        make_format(tool_call_parser)  # an unknown name fails here, not on the first request

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await async_engine.start_async()
        try:
            yield
        finally:
            if shutdown_engine:
                await async_engine.shutdown_async(shutdown_timeout)

    app = FastAPI(
        title="heddle",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.heddle = ServerState(
        engine=async_engine,
        tokenizer=tokenizer,
        model_name=name,
        metrics=ServerMetrics(async_engine),
        aliases=frozenset(aliases),
        tool_call_parser=tool_call_parser,
    )
    install_error_handlers(app)
    app.include_router(router)
    install_dashboard(app, async_engine, title=f"heddle serve — {name}")
    # The last middleware added runs first: check the key before reading a large body.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


ENGINE_CORE_MODES = ("process", "thread")


def run_server(
    config: EngineConfig | None = None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_timeout: float = 10.0,
    log_level: str = "info",
    engine: Engine | None = None,
    engine_core: str = "process",
    tool_call_parser: str = "auto",
    **engine_kwargs: Any,
) -> int:
    """Load the model and serve until a signal; returns 0.

    `engine_core="process"` (the default) runs the engine core in its own process, which loads
    the model; "thread" runs it in a thread of this process, as does passing a built `engine`.
    Raises HeddleError (e.g. ModelLoadError) for what the user can fix.
    """
    if engine_core not in ENGINE_CORE_MODES:
        raise HeddleError(f"unknown engine core mode {engine_core!r}: use process or thread")
    config = config or EngineConfig()
    client: EngineClient
    if engine is None and engine_core == "process":
        plan = plan_cpus(available_cpus(), config.model.num_threads)
        if plan.core_threads != config.model.num_threads:
            config = replace(config, model=replace(config.model, num_threads=plan.core_threads))
        plan.pin_this_process()
        core = CoreClient(
            partial(engine_from_config, config, **engine_kwargs),
            cpus=plan.core_cpus,
            event_source=view_source,  # the live dashboard's steps and decision events
        )
        core.start()  # the model loads in the core; HeddleError here if it cannot
        client = core
    else:
        if engine is None:
            engine = Engine.from_config(config, **engine_kwargs)
        client = AsyncEngine(engine)
    aliases = [config.model.model] if config.model.model else []
    try:
        app = build_app(
            client,
            model_name=served_model_name,
            aliases=aliases,
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout,
            tool_call_parser=tool_call_parser,
        )
        uvicorn_config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            # A backstop only: _DrainingServer ends the requests itself at shutdown_timeout.
            timeout_graceful_shutdown=math.ceil(shutdown_timeout) + 5,
            lifespan="on",
        )
        server = _DrainingServer(uvicorn_config, client, shutdown_timeout)
        with _signals_end_gracefully():
            server.run()
    finally:
        client.shutdown(shutdown_timeout)
    return 0


class _DrainingServer(uvicorn.Server):
    """On shutdown, give in-flight requests `drain_timeout` seconds, then abort them in the
    engine: their streams end cleanly (finish_reason "abort", then [DONE]) instead of being
    cancelled mid-write by uvicorn."""

    def __init__(
        self, config: uvicorn.Config, async_engine: EngineClient, drain_timeout: float
    ) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout = drain_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.drain_timeout, self.async_engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


@contextlib.contextmanager
def _signals_end_gracefully() -> Iterator[None]:
    """uvicorn re-raises the signal that stopped it once it is done; with these handlers in
    place that re-raise is a no-op, so a SIGTERM ends the process with status 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
