"""A live heddle server on 127.0.0.1 for tests: the real embedded model, uvicorn in a thread.

The model is loaded once per test session and shared by the servers of every module (one
server at a time); each module builds its own Engine over it with its own scheduler settings.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from typing import Any

import pytest
import uvicorn

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.async_engine import AsyncEngine
from heddle.engine.engine import Engine
from heddle.server.app import build_app

CACHE = CacheConfig(block_size=16, num_blocks=256)  # 4096 tokens of KV cache
MAX_MODEL_LEN = 512  # keeps "prompt longer than the context" cheap to test
API_KEY = "test-key"


def require_embedded_model() -> None:
    """Skip the test when the embedded model is not installed; any other error propagates
    (a broken model lookup must fail the live tests, not skip them silently)."""
    from heddle.errors import ModelNotFoundError
    from heddle.model.registry import default_model_path

    try:
        default_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the embedded model is not installed: {e}")


@functools.cache
def shared_executor() -> Any:
    """The embedded model's executor, loaded once; skips the test when it is not installed."""
    from heddle.model.executor import ModelExecutor

    require_embedded_model()
    # quantization auto (the default): an engine core started by a test reads the kernel plan
    # this process tuned (tests/conftest.py points both at one HEDDLE_TUNING_CACHE), so the two
    # run the same kernels and their logprobs agree.
    return ModelExecutor(ModelConfig(num_threads=2), CACHE)


def real_engine(max_model_len: int = MAX_MODEL_LEN, **scheduler: Any) -> Engine:
    executor = shared_executor()
    config = EngineConfig(cache=CACHE, scheduler=SchedulerConfig(**scheduler))
    return Engine(
        config,
        executor,
        num_blocks=executor.num_blocks,
        tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id,
        max_model_len=max_model_len,
        vocab_size=executor.model_shape.vocab_size,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def core_config(max_model_len: int = MAX_MODEL_LEN, **scheduler: Any) -> EngineConfig:
    """The config of real_engine(), for an engine core in its own process."""
    model = ModelConfig(num_threads=2, max_model_len=max_model_len)
    return EngineConfig(model=model, cache=CACHE, scheduler=SchedulerConfig(**scheduler))


class AppServer:
    """uvicorn serving an ASGI app on 127.0.0.1 in a daemon thread (a context manager)."""

    def __init__(self, app: Any, *, lifespan: str = "auto") -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan=lifespan
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> AppServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class LiveServer:
    """uvicorn serving `build_app(AsyncEngine(engine))` (or over `client`, e.g. a CoreClient
    whose engine runs in its own process) in a daemon thread."""

    def __init__(
        self, engine: Engine | None = None, *, client: Any = None, **app_options: Any
    ) -> None:
        self.engine = engine
        self.async_engine = client if client is not None else AsyncEngine(engine)
        self.app = build_app(self.async_engine, **app_options)
        self.http = AppServer(self.app, lifespan="on")
        self.port = self.http.port

    @property
    def base_url(self) -> str:
        return self.http.url

    def start(self) -> LiveServer:
        self.http.__enter__()
        return self

    def stop(self) -> None:
        self.http.__exit__()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is left in the engine and every KV block is back in the pool."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.async_engine.stats
            if (
                stats.num_running == 0
                and stats.num_waiting == 0
                and stats.kv_blocks_used == 0
                and (self.engine is None or not self.engine.has_unfinished_requests())
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the engine is not idle: {stats}")
            time.sleep(0.02)

    def assert_pool_whole(self) -> None:
        self.wait_idle()
        if self.engine is not None:  # else the core's stats said it: no block in use
            assert self.engine.kv_cache.num_used_blocks == 0
            self.engine.check_integrity()
