"""The engine loop in a background thread, with an asyncio stream of outputs per request.

The event loop never runs the model: `add_request` and `abort` queue a command for the engine
thread, which applies pending commands before every step and hands each step's outputs back to
the event loop that owns the request (`loop.call_soon_threadsafe`). Only the engine thread
touches the `Engine`; other threads read the `EngineStats` snapshot it publishes after each
step. When there is nothing to do the thread sleeps on a condition variable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from heddle.engine.engine import Engine
from heddle.engine.outputs import RequestOutput
from heddle.errors import HeddleError
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat
from heddle.request import SamplingParams

logger = logging.getLogger(__name__)

# When the scheduler has requests but schedules nothing (a child waiting on its parent, say),
# re-check this often instead of spinning.
_STALLED_WAIT_S = 0.005

StepListener = Callable[[list[RequestRecord], list[StepStat]], None]


class EngineDeadError(HeddleError):
    """The engine loop has stopped (shut down, or failed beyond recovery)."""


class EngineStepError(RuntimeError):
    """A step raised; every request in flight at that moment fails with this error."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's state, published by the engine thread after each step."""

    num_running: int = 0
    num_waiting: int = 0
    num_preempted: int = 0  # waiting again after preemption
    num_preemptions_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefix_cache_hit_rate: float = 0.0
    num_steps: int = 0


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    kwargs: dict[str, Any]
    stream: RequestStream
    accepted: concurrent.futures.Future[None]


@dataclass(slots=True)
class _Abort:
    request_id: str | None  # None: every request in flight


@dataclass(slots=True)
class _CloseSession:
    session_id: str


class RequestStream:
    """The outputs of one request, in order; ends after the finished output or an error."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def _put(self, item: RequestOutput | BaseException) -> None:
        """Runs on the stream's event loop."""
        self._queue.put_nowait(item)


@dataclass(slots=True)
class _Delivery:
    """Items for the streams of one event loop, handed over in one call_soon_threadsafe."""

    items: list[tuple[RequestStream, RequestOutput | BaseException]] = field(default_factory=list)

    def run(self) -> None:
        for stream, item in self.items:
            stream._put(item)


class AsyncEngine:
    """Runs `engine` in a daemon thread; many asyncio tasks may submit and stream requests."""

    def __init__(self, engine: Engine, *, keep_records: bool = False) -> None:
        self.engine = engine
        # Without keep_records, finished records and step stats are handed to the listeners and
        # dropped, so a long-running server does not grow without bound.
        self.keep_records = keep_records
        self.records: list[RequestRecord] = []
        self._cond = threading.Condition()
        self._commands: deque[_Add | _Abort | _CloseSession] = deque()
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._listeners: list[StepListener] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        # False when the last step scheduled nothing although requests were waiting.
        self._scheduled_last_step = True
        self.stats = EngineStats()
        self._publish_stats()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            if self._stopping:
                raise EngineDeadError("the engine has been shut down")
            self._thread = threading.Thread(target=self._run, name="heddle-engine", daemon=True)
            self._thread.start()

    async def start_async(self) -> None:
        self.start()

    @property
    def model_name(self) -> str:
        return getattr(self.engine.executor, "model_name", None) or "heddle"

    @property
    def max_model_len(self) -> int | None:
        return self.engine.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def error(self) -> BaseException | None:
        """Why the loop died, if it did."""
        return self._dead

    def add_listener(self, listener: StepListener) -> None:
        """Called on the engine thread after each step with the records and step stats it made."""
        self._listeners.append(listener)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Abort what is in flight (streams end with finish_reason "abort") and stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    async def shutdown_async(self, timeout: float | None = 10.0) -> None:
        await asyncio.to_thread(self.shutdown, timeout)

    # -- requests ---------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        **kwargs: Any,
    ) -> RequestStream:
        """Queue a request; returns its stream once the engine has accepted it.

        Raises what Engine.add_request raises (InvalidRequestError, QueueFullError), or
        EngineDeadError. Keyword arguments are Engine.add_request's (prompt, priority, ...).
        """
        if self._dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        self.start()
        stream = RequestStream(request_id, asyncio.get_running_loop())
        accepted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(_Add(request_id, prompt_token_ids, params, kwargs, stream, accepted))
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:
            self.abort(request_id)  # the command may still be applied: undo it
            raise
        return stream

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        **kwargs: Any,
    ) -> AsyncIterator[RequestOutput]:
        """add_request + iterate; leaving the loop early (or being cancelled) aborts."""
        stream = await self.add_request(request_id, prompt_token_ids, params, **kwargs)
        try:
            async for output in stream:
                yield output
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request before the next step (its KV blocks return to the pool there).

        Thread-safe and non-blocking; aborting a finished or unknown request does nothing.
        """
        self._submit(_Abort(request_id))

    def abort_all(self) -> None:
        """Abort every request in flight before the next step (e.g. when a drain times out)."""
        self._submit(_Abort(None))

    def close_session(self, session_id: str) -> None:
        """Close an agent session before the next step (its parked KV is freed there).
        Thread-safe and non-blocking."""
        self._submit(_CloseSession(session_id))

    def _submit(self, command: _Add | _Abort | _CloseSession) -> None:
        with self._cond:
            if self._stopping:  # the loop is gone or going: nothing will read the queue
                if isinstance(command, _Add):
                    command.accepted.set_exception(EngineDeadError("the engine is not running"))
                return
            self._commands.append(command)
            self._cond.notify()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                commands = self._wait_for_work()
                if commands is None:
                    break
                self._apply(commands)
                if self.engine.has_unfinished_requests():
                    self._step()
                else:  # aborts may have finished the last requests
                    self._publish_stats()
                    self._notify_listeners()
        except BaseException as e:  # never leave streams hanging, whatever happened
            logger.exception("the engine loop died")
            self._dead = e
            self._fail_all(EngineDeadError(f"the engine loop died: {e!r}"))
            self._reject_pending(EngineDeadError("the engine loop died"))
            return
        self._abort_all()
        self._reject_pending(EngineDeadError("the engine is shutting down"))

    def _wait_for_work(self) -> list[_Add | _Abort | _CloseSession] | None:
        """Pending commands, once there is something to do; None when shutting down."""
        with self._cond:
            while not self._commands and not self._stopping:
                if self.engine.has_unfinished_requests():
                    if self._scheduled_last_step:
                        break
                    self._cond.wait(_STALLED_WAIT_S)
                    break
                self._cond.wait()
            if self._stopping:
                return None
            commands = list(self._commands)
            self._commands.clear()
            return commands

    def _apply(self, commands: list[_Add | _Abort | _CloseSession]) -> None:
        for command in commands:
            if isinstance(command, _Add):
                self._apply_add(command)
                continue
            if isinstance(command, _CloseSession):
                self.engine.close_session(command.session_id)
                continue
            if command.request_id is None:
                self._abort_all()
                continue
            final = self.engine.abort_request(command.request_id)
            stream = self._streams.pop(command.request_id, None)
            if stream is not None and final is not None:
                self._deliver([(stream, final)])

    def _apply_add(self, command: _Add) -> None:
        if not command.accepted.set_running_or_notify_cancel():
            return  # the caller gave up before the engine got to it
        try:
            self.engine.add_request(
                command.request_id, command.prompt_token_ids, command.params, **command.kwargs
            )
        except Exception as e:
            command.accepted.set_exception(e)
            return
        self._streams[command.request_id] = command.stream
        command.accepted.set_result(None)

    def _step(self) -> None:
        steps_before = self.engine.num_steps
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("an engine step failed; failing the requests in flight")
            request_ids = list(self._streams)
            self._fail_all(EngineStepError(f"the engine step failed: {e!r}"))
            self._recover(request_ids)
            return
        self._scheduled_last_step = self.engine.num_steps != steps_before
        items: list[tuple[RequestStream, RequestOutput | BaseException]] = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            items.append((stream, output))
        self._deliver(items)
        self._publish_stats()
        self._notify_listeners()

    def _recover(self, request_ids: list[str]) -> None:
        """After a failed step: drop every request so the KV pool is whole again."""
        for request_id in request_ids:
            self.engine.abort_request(request_id)
        self.engine.kv_cache.check_integrity()  # raises (killing the loop) if beyond repair
        self._publish_stats()
        self._notify_listeners()

    def _fail_all(self, error: BaseException) -> None:
        items: list[tuple[RequestStream, RequestOutput | BaseException]] = [
            (stream, error) for stream in self._streams.values()
        ]
        self._streams.clear()
        self._deliver(items)

    def _abort_all(self) -> None:
        items: list[tuple[RequestStream, RequestOutput | BaseException]] = []
        for request_id, stream in list(self._streams.items()):
            final = self.engine.abort_request(request_id)
            if final is not None:
                items.append((stream, final))
        self._streams.clear()
        self._deliver(items)
        self._publish_stats()
        self._notify_listeners()

    def _reject_pending(self, error: BaseException) -> None:
        with self._cond:
            self._stopping = True
            commands = list(self._commands)
            self._commands.clear()
        for command in commands:
            if isinstance(command, _Add) and not command.accepted.done():
                command.accepted.set_exception(error)

    def _deliver(self, items: list[tuple[RequestStream, RequestOutput | BaseException]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, _Delivery] = {}
        for stream, item in items:
            by_loop.setdefault(stream.loop, _Delivery()).items.append((stream, item))
        for loop, delivery in by_loop.items():
            # A closed loop raises RuntimeError: nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(delivery.run)

    def _publish_stats(self) -> None:
        stats = self.engine.scheduler.stats()
        self.stats = EngineStats(
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_preempted=stats.num_preempted,
            num_preemptions_total=stats.num_preemptions_total,
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_free=stats.kv_blocks_total - stats.kv_blocks_used,
            prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
            num_steps=self.engine.num_steps,
        )

    def _notify_listeners(self) -> None:
        records = self.engine.finished_records
        steps = self.engine.step_stats
        if not records and not steps:
            return
        new_records, new_steps = list(records), list(steps)
        records.clear()
        steps.clear()
        if self.keep_records:
            self.records.extend(new_records)
        for listener in self._listeners:
            try:
                listener(new_records, new_steps)
            except Exception:
                logger.exception("a step listener failed")
