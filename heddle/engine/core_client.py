"""The front end's handle on an engine core running in its own process.

`CoreClient` has AsyncEngine's surface (add_request -> RequestStream, abort, stats, listeners),
but the Engine runs in a child process (heddle/engine/core_process.py) that owns its CPUs: this
process only parses HTTP, tokenizes, detokenizes and streams. Commands go out batched per event
loop tick; each core step comes back as one StepBatch, read by one task on the event loop,
which detokenizes, finds stop strings (and tells the core to end that sequence) and hands each
request's RequestOutput to its stream.

When the core process dies, every request in flight fails at once with EngineDeadError (a 503
for a waiting client, an error event for a stream), `error` says why (so /health answers 503),
new requests get 503 while a new core starts, and then the server serves again. The core's KV
cache died with it: nothing can leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from heddle.engine.async_engine import (
    EngineDeadError,
    EngineStats,
    EngineStepError,
    RequestStream,
    StepListener,
)
from heddle.engine.core_process import CoreSpec, EngineFactory
from heddle.engine.front_state import RequestState
from heddle.engine.wire import (
    Abort,
    Add,
    CloseSession,
    Command,
    Ready,
    Shutdown,
    StepBatch,
    decode_batch,
    decode_ready,
    encode_commands,
)
from heddle.errors import HeddleError, InvalidRequestError, QueueFullError
from heddle.request import SamplingParams

logger = logging.getLogger(__name__)

EventListener = Callable[[list[Any]], None]

# Not `-m heddle.engine.core_process`: the spec on stdin must unpickle as that module's CoreSpec,
# not as a class of `__main__`.
_CORE_MAIN = "import sys; from heddle.engine.core_process import main; sys.exit(main())"


class _CoreHandle:
    """One incarnation of the core: its process and the two sockets bound for it."""

    def __init__(self, context: zmq.Context, spec_for: Callable[[str, str], CoreSpec]) -> None:
        self.dir = tempfile.mkdtemp(prefix="heddle-core-")
        commands_address = f"ipc://{self.dir}/commands"
        outputs_address = f"ipc://{self.dir}/outputs"
        self.commands = context.socket(zmq.PUSH)
        self.outputs = context.socket(zmq.PULL)
        for socket, option in ((self.commands, zmq.SNDHWM), (self.outputs, zmq.RCVHWM)):
            socket.setsockopt(option, 0)  # never drop or block on a full queue
            socket.setsockopt(zmq.LINGER, 0)
        self.commands.bind(commands_address)
        self.outputs.bind(outputs_address)
        spec = spec_for(commands_address, outputs_address)
        self.process = subprocess.Popen([sys.executable, "-c", _CORE_MAIN], stdin=subprocess.PIPE)
        assert self.process.stdin is not None
        # The parent's import path first (as multiprocessing's spawn does), so that the factory
        # unpickles wherever it was importable from here (a test package, say).
        pickle.dump(list(sys.path), self.process.stdin)
        pickle.dump(spec, self.process.stdin)
        self.process.stdin.close()
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(self.process.pid)
        self.async_outputs: zmq.asyncio.Socket | None = None
        self.reader: asyncio.Task[None] | None = None
        self.expected_exit = False
        self.closed = False

    @property
    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def wait_ready(self, timeout: float) -> Ready:
        """Block until the core has loaded its engine. Raises HeddleError if it cannot."""
        deadline = time.monotonic() + timeout
        while not self.outputs.poll(100):
            if self.process.poll() is not None:
                raise EngineDeadError(
                    f"the engine core exited while starting (status {self.process.returncode})"
                )
            if time.monotonic() > deadline:
                raise EngineDeadError(f"the engine core did not start within {timeout:.0f} s")
        first = self.outputs.recv()
        if first[:1] == b"E":
            kind, _, message = first[1:].decode().partition("\0")
            raise (HeddleError if kind == "user" else EngineDeadError)(message)
        return decode_ready(first[1:])

    def close(self, timeout: float = 5.0) -> None:
        """Wait for the process to end (kill it after `timeout`) and release everything."""
        if self.closed:
            return
        self.closed = True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if self.async_outputs is not None:
            self.async_outputs.close(linger=0)
        self.commands.close(linger=0)
        self.outputs.close(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)


class CoreClient:
    """An engine core process, driven from this process's asyncio event loop.

    `start()` spawns the core and blocks until its model is loaded (so the model's name and
    tokenizer are known); `start_async()` then attaches it to the running loop. All other
    methods run on that loop (abort and abort_all may be called from any thread).
    """

    def __init__(
        self,
        factory: EngineFactory,
        *,
        restart: bool = True,
        cpus: tuple[int, ...] | None = None,
        startup_timeout: float = 600.0,
        keep_records: bool = False,
        event_source: Callable[[Any], Callable[[], list[Any]]] | None = None,
        term_grace: float = 60.0,
    ) -> None:
        """`event_source(engine)` runs in the core and returns what to send after each step
        (see CoreSpec); the front end hands it to `add_event_listener` callbacks. `term_grace`:
        how long the core serves on after a SIGTERM (one to the process group reaches it too)
        waiting for this client's Shutdown; longer than this client's drain at shutdown."""
        if not term_grace > 0:
            raise ValueError("term_grace must be a positive number of seconds")
        self.factory = factory
        self.term_grace = term_grace
        self.event_source = event_source
        self.restart = restart
        self.cpus = cpus
        self.startup_timeout = startup_timeout
        self.keep_records = keep_records
        self.records: list[Any] = []
        self.stats = EngineStats()
        self.num_restarts = 0
        self.info: Ready | None = None
        self._tokenizer: Any = None
        self._context = zmq.Context(io_threads=1)
        self._handle: _CoreHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requests: dict[str, RequestState] = {}
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._outbox: list[Command] = []
        self._flush_scheduled = False
        self._listeners: list[StepListener] = []
        self._event_listeners: list[EventListener] = []
        self._dead: BaseException | None = None
        self._stopping = False
        self._restarting: asyncio.Task[None] | None = None
        self._spawning: _CoreHandle | None = None  # a core starting (not yet ready)

    # -- what the server reads --------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.info.model_name if self.info is not None else "heddle"

    @property
    def max_model_len(self) -> int | None:
        return self.info.max_model_len if self.info is not None else None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def error(self) -> BaseException | None:
        if self._dead is None and self._handle is None and not self._stopping:
            return EngineDeadError("the engine core has not started")
        return self._dead

    @property
    def is_running(self) -> bool:
        return self._handle is not None and self._handle.alive and self._dead is None

    @property
    def core_pid(self) -> int | None:
        return self._handle.process.pid if self._handle is not None else None

    def add_listener(self, listener: StepListener) -> None:
        """Called on the event loop with the finished records and step stats of each batch."""
        self._listeners.append(listener)

    def add_event_listener(self, listener: EventListener) -> None:
        """Called on the event loop with the per-step events the core sent (the live view)."""
        self._event_listeners.append(listener)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the core and wait until it is ready (a model load). Raises HeddleError."""
        if self._handle is not None:
            return
        if self._stopping:
            raise EngineDeadError("the engine has been shut down")
        self._handle, self.info = self._spawn()
        self._tokenizer = pickle.loads(self.info.tokenizer)

    def _spawn(self) -> tuple[_CoreHandle, Ready]:
        def spec_for(commands: str, outputs: str) -> CoreSpec:
            return CoreSpec(
                self.factory,
                commands,
                outputs,
                self.cpus,
                event_source=self.event_source,
                term_grace=self.term_grace,
            )

        handle = _CoreHandle(self._context, spec_for)
        self._spawning = handle
        try:
            if self._stopping:  # shut down while this thread was on its way here
                raise EngineDeadError("the engine has been shut down")
            ready = handle.wait_ready(self.startup_timeout)
        except BaseException:
            handle.process.kill()
            handle.close()
            raise
        finally:
            self._spawning = None
        logger.info("engine core ready (pid %d, %s)", ready.pid, ready.model_name)
        return handle, ready

    async def start_async(self) -> None:
        if self._handle is None:
            await asyncio.to_thread(self.start)
        assert self._handle is not None
        if self._handle.reader is None:
            self._attach(self._handle)

    def _attach(self, handle: _CoreHandle) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        handle.async_outputs = zmq.asyncio.Socket.shadow(handle.outputs.underlying)
        handle.reader = loop.create_task(self._read(handle))
        if handle.pidfd is not None:
            loop.add_reader(handle.pidfd, self._core_exited, handle)

    async def shutdown_async(self, timeout: float | None = 10.0) -> None:
        """Abort what is in flight (streams end with finish_reason "abort"), stop the core."""
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
            self._stop_spawning()
        handle = self._handle
        if handle is not None and handle.alive:
            handle.expected_exit = True
            self._send(Shutdown())
            self._flush()
            if handle.reader is not None:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(handle.reader), timeout)
        self._fail_all(EngineDeadError("the engine is shutting down"))
        if handle is not None:
            self._detach(handle)
            await asyncio.to_thread(handle.close, timeout or 10.0)

    def _stop_spawning(self) -> None:
        """A restart's core still loading: killed, so that its thread (`_spawn`, which closes
        it) ends now instead of after a model load, and no core outlives the shutdown."""
        spawning = self._spawning
        if spawning is not None:
            with contextlib.suppress(OSError):
                spawning.process.kill()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """From outside the event loop (after it ended): stop the core process."""
        self._stopping = True
        self._stop_spawning()
        handle = self._handle
        if handle is None or handle.closed:
            return
        if handle.alive:
            handle.expected_exit = True
            with contextlib.suppress(zmq.ZMQError):
                handle.commands.send(encode_commands([Shutdown()]), zmq.NOBLOCK)
        handle.close(timeout or 10.0)

    # -- requests ---------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        **kwargs: Any,
    ) -> RequestStream:
        """Queue a request; returns its stream once the core has accepted it.

        Raises InvalidRequestError, QueueFullError (from the core), or EngineDeadError.
        """
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")
        if self._dead is not None:
            raise EngineDeadError(f"the engine is not available: {self._dead}")
        await self.start_async()
        if request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, loop)
        prompt = kwargs.pop("prompt", None)
        self._requests[request_id] = RequestState(
            request_id, prompt, list(prompt_token_ids), params, stream, self._tokenizer
        )
        accepted: asyncio.Future[None] = loop.create_future()
        self._pending[request_id] = accepted
        self._send(Add(request_id, list(prompt_token_ids), params, kwargs))
        try:
            await accepted
        except asyncio.CancelledError:
            self._pending.pop(request_id, None)
            self.abort(request_id)  # the core may still add it: undo that
            raise
        except BaseException:
            self._requests.pop(request_id, None)
            raise
        return stream

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, **kwargs: Any
    ) -> Any:
        """add_request + iterate; leaving the loop early (or being cancelled) aborts."""
        stream = await self.add_request(request_id, prompt_token_ids, params, **kwargs)
        try:
            async for output in stream:
                yield output
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """End a request in the core before its next step; its stream ends with "abort"."""
        self._send(Abort(request_id))

    def abort_all(self) -> None:
        self._send(Abort(None))

    def close_session(self, session_id: str) -> None:
        """Close an agent session in the core before its next step (its parked KV is freed)."""
        self._send(CloseSession(session_id))

    def _send(self, command: Command) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if _on_loop(loop):
            self._outbox.append(command)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._send, command)

    def _flush(self) -> None:
        """Send what this tick queued, in one message."""
        self._flush_scheduled = False
        if not self._outbox:
            return
        commands, self._outbox = self._outbox, []
        handle = self._handle
        if handle is None or not handle.alive:
            self._reject([c for c in commands if isinstance(c, Add)])
            return
        try:
            handle.commands.send(encode_commands(commands), zmq.NOBLOCK)
        except zmq.ZMQError:  # no core connected: it is gone (its exit is on the way)
            self._reject([c for c in commands if isinstance(c, Add)])

    def _reject(self, adds: list[Add]) -> None:
        for add in adds:
            future = self._pending.pop(add.request_id, None)
            self._requests.pop(add.request_id, None)
            if future is not None and not future.done():
                future.set_exception(EngineDeadError("the engine core is not available"))

    # -- the core's outputs -----------------------------------------------------------------
    async def _read(self, handle: _CoreHandle) -> None:
        socket = handle.async_outputs
        assert socket is not None
        try:
            while True:
                data = await socket.recv()
                batch = decode_batch(data)
                self._on_batch(batch)
                if batch.final:
                    return
        except (asyncio.CancelledError, zmq.ZMQError):
            return
        except Exception:  # a bug on this side: treat the core as lost rather than hang
            logger.exception("reading the engine core's outputs failed")
            self._core_lost(handle, "the engine core's outputs could not be read")

    def _on_batch(self, batch: StepBatch) -> None:
        for request_id in batch.accepted:
            future = self._pending.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        for rejected in batch.rejected:
            future = self._pending.pop(rejected.request_id, None)
            self._requests.pop(rejected.request_id, None)
            if future is None or future.done():
                continue
            error: Exception
            if rejected.kind == "invalid":
                error = InvalidRequestError(rejected.message, rejected.param)
            elif rejected.kind == "queue_full":
                error = QueueFullError(
                    rejected.message,
                    retry_after=rejected.retry_after,
                    reason=rejected.reason or "queue_full",
                    request_class=rejected.request_class,
                )
            else:
                error = RuntimeError(rejected.message)
            future.set_exception(error)
        touched: dict[str, RequestState] = {}
        stops: list[Command] = []
        for delta in batch.deltas:
            state = self._requests.get(delta.request_id)
            if state is None:
                continue  # ended here already (a stop string, a failure)
            stop = state.apply(delta)
            if stop is not None:
                stops.append(stop)
            touched[delta.request_id] = state
        for command in stops:
            self._send(command)
        for request_id, state in touched.items():
            output = state.output()
            state.stream._put(output)
            if output.finished:
                del self._requests[request_id]
        if batch.failed_ids:
            error_ = EngineStepError(batch.failure or "the engine step failed")
            for request_id in batch.failed_ids:
                failed = self._requests.pop(request_id, None)
                if failed is not None:
                    failed.stream._put(error_)
        if batch.stats is not None:
            self.stats = EngineStats(**msgspec.structs.asdict(batch.stats))
        if batch.records or batch.steps:
            if self.keep_records:
                self.records.extend(batch.records)
            for listener in self._listeners:
                try:
                    listener(batch.records, batch.steps)
                except Exception:
                    logger.exception("a step listener failed")
        if batch.events:
            for event_listener in self._event_listeners:
                try:
                    event_listener(batch.events)
                except Exception:
                    logger.exception("an event listener failed")

    # -- a core that dies -------------------------------------------------------------------
    def _core_exited(self, handle: _CoreHandle) -> None:
        status = handle.process.poll()
        self._core_lost(handle, f"the engine core process exited (status {status})")

    def _core_lost(self, handle: _CoreHandle, reason: str) -> None:
        if handle is not self._handle:
            return
        self._detach(handle)
        handle.close(0.0)
        if handle.expected_exit or self._stopping:
            return
        logger.error("%s; failing %d requests in flight", reason, len(self._requests))
        self._dead = EngineDeadError(f"{reason}; restarting it" if self.restart else reason)
        self._fail_all(EngineDeadError(reason))
        self.stats = EngineStats()
        if self.restart and self._loop is not None:
            self._restarting = self._loop.create_task(self._restart())

    def _detach(self, handle: _CoreHandle) -> None:
        if self._loop is not None and handle.pidfd is not None and not self._loop.is_closed():
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(handle.pidfd)
        if handle.reader is not None and handle.reader is not asyncio.current_task():
            handle.reader.cancel()

    async def _restart(self) -> None:
        delay = 0.5
        while not self._stopping:
            spawn = asyncio.ensure_future(asyncio.to_thread(self._spawn))
            try:
                handle, ready = await asyncio.shield(spawn)
            except asyncio.CancelledError:  # shut down meanwhile: a core it starts is closed
                spawn.add_done_callback(_close_spawned)
                raise
            except Exception as e:
                logger.error("restarting the engine core failed (%s); retrying in %.1f s", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._stopping:
                handle.process.kill()
                handle.close()
                return
            self._handle, self.info = handle, ready
            self._attach(handle)
            self._dead = None
            self.num_restarts += 1
            logger.warning("engine core restarted (pid %d)", ready.pid)
            return

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for state in self._requests.values():
            state.stream._put(error)
        self._requests.clear()
        self._outbox.clear()


def _close_spawned(spawn: asyncio.Future[tuple[_CoreHandle, Ready]]) -> None:
    """A restart's spawn that finished after the restart was cancelled: its core is stopped."""
    if spawn.cancelled() or spawn.exception() is not None:
        return
    handle, _ = spawn.result()
    handle.process.kill()
    handle.close()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
