"""The engine core process: schedule and step, nothing else.

Started by `CoreClient` (heddle/engine/core_client.py) as a child Python running `main()`, with a
pickled `CoreSpec` on stdin. It builds its Engine (the model loads here), connects two
ZeroMQ sockets to the front end, sends `Ready`, then loops:

    take every pending command (Add / Abort / Stop / Shutdown) without waiting while busy
    apply them between steps (aborts and stops free KV blocks before the next step)
    one Engine.step()
    send one StepBatch: new token ids per sequence, command answers, stats, records, events

The engine here does not detokenize: the front end turns token ids into text, finds stop
strings and sends `Stop` back. The core exits on `Shutdown`, or when its parent process is gone
(SIGINT is ignored and SIGTERM deferred: a signal to the process group reaches the front end,
which drains its requests first, then sends Shutdown):
a watchdog thread (`watch_parent`) polls for that in every phase (the model loading, warm-up,
between and during steps), so the core never outlives its front end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from heddle.config import EngineConfig
from heddle.engine.engine import Engine
from heddle.engine.outputs import RequestOutput
from heddle.engine.wire import (
    Abort,
    Add,
    CloseSession,
    Command,
    Delta,
    Ready,
    Rejected,
    Shutdown,
    Stats,
    StepBatch,
    Stop,
    decode_commands,
    encode_batch,
    encode_ready,
)
from heddle.errors import HeddleError, InvalidRequestError, QueueFullError
from heddle.request import RequestStatus

logger = logging.getLogger(__name__)

# When requests are queued but none can be scheduled (a child waiting on its parent), re-check
# this often instead of spinning; when idle, check this often that the parent is still alive.
_STALLED_POLL_MS = 5
_IDLE_POLL_MS = 1000
# How often the watchdog thread checks that the parent is still alive (while the model loads,
# warms up, or a step runs long).
_PARENT_POLL_S = 0.2

EngineFactory = Callable[[], Engine]


@dataclass(slots=True)
class CoreSpec:
    """How to start one core: what it runs, where it talks, which CPUs it may use."""

    factory: EngineFactory  # module-level function or functools.partial (it is pickled)
    commands_address: str  # the front end binds; the core connects and reads
    outputs_address: str  # the front end binds; the core connects and writes
    cpus: tuple[int, ...] | None = None  # sched_setaffinity before the model loads
    parent_pid: int = field(default_factory=os.getpid)
    warm_up: bool = True  # one short request before Ready (see warm_up())
    # Per-step data for the front end (the live view's decision events): given the engine, a
    # callable that returns what to send after each step (msgpack-able values). Pickled.
    event_source: Callable[[Engine], Callable[[], list[Any]]] | None = None
    # Seconds the core serves on after a SIGTERM, waiting for the front end's Shutdown (a
    # SIGTERM to the process group reaches both; the front end drains first).
    term_grace: float = 60.0


def engine_from_config(config: EngineConfig, **engine_kwargs: Any) -> Engine:
    """The default factory: the real model named in the config."""
    return Engine.from_config(config, **engine_kwargs)


class EngineCore:
    """The loop around one Engine, talking through two sockets."""

    def __init__(self, engine: Engine, commands: zmq.Socket, outputs: zmq.Socket) -> None:
        self.engine = engine
        engine.tokenizer = None  # the front end detokenizes and finds stop strings
        self.commands = commands
        self.outputs = outputs
        self.live: set[str] = set()  # request ids the engine holds
        self._finished_sent: set[tuple[str, int]] = set()
        self._logprobs_sent: dict[tuple[str, int], int] = {}
        self._scheduled_last_step = True
        # Called after each pass; what they return rides in StepBatch.events.
        self.event_sources: list[Callable[[], list[Any]]] = []

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.commands, zmq.POLLIN)
        first = StepBatch()
        self.finish(first)  # the front end's stats start out right
        self.outputs.send(encode_batch(first), copy=False)
        while True:
            busy = self.engine.has_unfinished_requests()
            if not busy:
                timeout: int | None = _IDLE_POLL_MS
            else:
                timeout = 0 if self._scheduled_last_step else _STALLED_POLL_MS
            commands: list[Command] = []
            if poller.poll(timeout):
                while True:
                    try:
                        commands.extend(decode_commands(self.commands.recv(zmq.NOBLOCK)))
                    except zmq.Again:
                        break
            batch = StepBatch()
            shutdown = self.apply(commands, batch)
            if shutdown:
                for request_id in list(self.live):
                    self._take(self.engine.abort_request(request_id), batch)
                self.live.clear()
                batch.final = True
            elif self.engine.has_unfinished_requests():
                self.step(batch)
            self.finish(batch)
            sending = batch.deltas or batch.steps or batch.events or batch.failed_ids
            if commands or sending or batch.final:
                self.outputs.send(encode_batch(batch), copy=False)
            if shutdown:
                return

    # -- commands ---------------------------------------------------------------------------
    def apply(self, commands: list[Command], batch: StepBatch) -> bool:
        """Apply commands in order; True on Shutdown."""
        for command in commands:
            if isinstance(command, Add):
                self._add(command, batch)
            elif isinstance(command, Abort):
                ids = list(self.live) if command.request_id is None else [command.request_id]
                for request_id in ids:
                    self._take(self.engine.abort_request(request_id), batch)
            elif isinstance(command, Stop):
                output = self.engine.stop_sequence(command.request_id, command.index, command.stop)
                self._take(output, batch)
            elif isinstance(command, CloseSession):
                self.engine.close_session(command.session_id)
            elif isinstance(command, Shutdown):
                return True
        return False

    def _add(self, command: Add, batch: StepBatch) -> None:
        try:
            self.engine.add_request(
                command.request_id, command.prompt_token_ids, command.params, **command.kwargs
            )
        except InvalidRequestError as e:
            batch.rejected.append(Rejected(command.request_id, "invalid", str(e), e.param))
            return
        except QueueFullError as e:
            batch.rejected.append(
                Rejected(
                    command.request_id,
                    "queue_full",
                    str(e),
                    retry_after=e.retry_after,
                    reason=e.reason,
                    request_class=e.request_class,
                )
            )
            return
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            logger.exception("adding request %s failed", command.request_id)
            batch.rejected.append(Rejected(command.request_id, "other", repr(e)))
            return
        self.live.add(command.request_id)
        batch.accepted.append(command.request_id)

    # -- one step ---------------------------------------------------------------------------
    def step(self, batch: StepBatch) -> None:
        steps_before = self.engine.num_steps
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("an engine step failed; failing the requests in flight")
            batch.failed_ids = list(self.live)
            batch.failure = f"the engine step failed: {e!r}"
            for request_id in batch.failed_ids:
                self.engine.abort_request(request_id)
                self._forget(request_id)
            self.live.clear()
            self.engine.kv_cache.check_integrity()  # raises (ending the core) if beyond repair
            return
        self._scheduled_last_step = self.engine.num_steps != steps_before
        for output in outputs:
            self._take(output, batch)

    def _take(self, output: RequestOutput | None, batch: StepBatch) -> None:
        """The new part of an engine output, as one Delta per sequence that has news."""
        if output is None:
            return
        request_id = output.request_id
        for c in output.outputs:
            key = (request_id, c.index)
            if key in self._finished_sent:
                continue
            if not c.delta_token_ids and c.finish_reason is None:
                continue
            logprobs = None
            if c.logprobs is not None:
                sent = self._logprobs_sent.get(key, 0)
                logprobs = c.logprobs[sent:]
                self._logprobs_sent[key] = len(c.logprobs)
            if c.finish_reason is not None:
                self._finished_sent.add(key)
            batch.deltas.append(
                Delta(
                    request_id,
                    c.index,
                    c.delta_token_ids,
                    c.finish_reason,
                    c.stop_reason,
                    logprobs,
                    output.num_cached_tokens,
                )
            )
        if output.finished:
            self.live.discard(request_id)
            self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        for key in [k for k in self._finished_sent if k[0] == request_id]:
            self._finished_sent.discard(key)
        for key in [k for k in self._logprobs_sent if k[0] == request_id]:
            del self._logprobs_sent[key]

    def finish(self, batch: StepBatch) -> None:
        """Stats, records, step stats and events of this pass."""
        engine = self.engine
        scheduler, kv = engine.scheduler, engine.kv_cache
        waiting = list(scheduler.waiting)
        batch.stats = Stats(
            num_running=len(scheduler.running),
            num_waiting=len(waiting),
            num_preempted=sum(1 for r in waiting if r.status is RequestStatus.PREEMPTED),
            num_preemptions_total=scheduler.num_preemptions,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_free=kv.num_free_blocks,
            prefix_cache_hit_rate=kv.prefix_hit_rate,
            num_steps=engine.num_steps,
        )
        if engine.finished_records:
            batch.records = list(engine.finished_records)
            engine.finished_records.clear()
        if engine.step_stats:
            batch.steps = list(engine.step_stats)
            engine.step_stats.clear()
        for source in self.event_sources:
            batch.events.extend(source())


def warm_up(engine: Engine) -> None:
    """Run one short request through the engine before saying Ready, and forget it.

    A fresh process pays for the first use of each kernel (oneDNN builds its matmul kernels,
    the decode kernel loads): measured at seconds for the first decode step on the 2-core box,
    which the first client would otherwise wait through.
    """
    from heddle.request import SamplingParams

    vocab = engine.vocab_size or 2
    prompt = [100 + i if vocab > 116 else i % vocab for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    try:
        engine.add_request("heddle-warm-up", prompt, params)
        for _ in range(64):
            if not engine.has_unfinished_requests():
                break
            engine.step()
    except Exception:
        logger.warning("the warm-up request failed; serving without it", exc_info=True)
    engine.abort_request("heddle-warm-up")
    engine.finished_records.clear()
    engine.step_stats.clear()
    engine.num_steps = 0
    engine.execute_seconds = engine.overhead_seconds = 0.0


def ready_message(engine: Engine) -> Ready:
    tokenizer = engine.tokenizer
    return Ready(
        pid=os.getpid(),
        model_name=getattr(engine.executor, "model_name", None) or "heddle",
        max_model_len=engine.max_model_len,
        vocab_size=engine.vocab_size,
        eos_token_id=engine.eos_token_id,
        num_blocks=engine.kv_cache.num_blocks,
        block_size=engine.config.cache.block_size,
        max_waiting=engine.config.scheduler.max_waiting,
        tokenizer=pickle.dumps(portable_tokenizer(tokenizer)),
    )


def portable_tokenizer(tokenizer: Any) -> Any:
    """A copy of the tokenizer that pickles (heddle's own is rebuilt from its parts)."""
    from heddle.model.tokenizer import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return Tokenizer(
            tokenizer.backend,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            chat_template=tokenizer.chat_template,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer


def serve(spec: CoreSpec) -> int:
    """Run one core until it is told to stop; returns the exit status."""
    # The front end decides when the core stops: a Ctrl-C reaches the whole process group,
    # and the front end first drains its requests, then sends Shutdown. So does a SIGTERM sent
    # to the group (`timeout`, `kill -- -PGID`, a service manager stopping the unit): the core
    # serves on while the front end drains, and exits on its own only `term_grace` seconds
    # later (a SIGTERM sent to the core alone, with no Shutdown to follow).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _deferred_sigterm(spec.term_grace))
    if spec.cpus:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(0, spec.cpus)
    context = zmq.Context(io_threads=1)
    commands = context.socket(zmq.PULL)
    outputs = context.socket(zmq.PUSH)
    for socket in (commands, outputs):
        socket.setsockopt(zmq.LINGER, 2000)
    commands.connect(spec.commands_address)
    outputs.connect(spec.outputs_address)
    try:
        try:
            engine = spec.factory()
        except HeddleError as e:  # a bad model path or option: one line, no traceback
            outputs.send(b"Euser\0" + str(e).encode())
            return 1
        if spec.warm_up:
            warm_up(engine)
        outputs.send(b"R" + encode_ready(ready_message(engine)))
        core = EngineCore(engine, commands, outputs)
        if spec.event_source is not None:
            core.event_sources.append(spec.event_source(engine))
        core.run()
    except Exception as e:
        logger.exception("the engine core failed")
        with contextlib.suppress(zmq.ZMQError):
            outputs.send(b"Ecore\0" + f"the engine core failed: {e!r}".encode(), zmq.NOBLOCK)
        return 1
    finally:
        commands.close()
        outputs.close()
        context.term()
    return 0


def _deferred_sigterm(grace: float) -> Callable[[int, Any], None]:
    """A SIGTERM handler: exit `grace` seconds from the first SIGTERM unless a Shutdown from the
    front end (or its death, `watch_parent`) ends the core first."""
    timer: list[threading.Timer] = []

    def exit_now() -> None:
        logger.warning("no Shutdown %.0f s after SIGTERM; the engine core exits", grace)
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        if timer:
            return
        logger.info("SIGTERM: serving on until the front end's Shutdown (at most %.0f s)", grace)
        timer.append(threading.Timer(grace, exit_now))
        timer[0].daemon = True
        timer[0].start()

    return on_sigterm


def watch_parent(parent_pid: int, interval: float = _PARENT_POLL_S) -> threading.Thread:
    """Exit this process as soon as its parent is no longer `parent_pid`.

    This is the one check for a vanished front end, in every phase: while the engine is built
    (a model loading for minutes), warmed up, between steps and during a long step (a
    `heddle serve` killed while starting used to leave its core behind). A parent's death
    re-parents the core (to init or a subreaper), so `os.getppid()` changes; polling it works
    whichever thread spawned the core (PR_SET_PDEATHSIG fires when that *thread* ends, which
    for a core restarted from a worker thread is not the front end's death) and across
    fork + exec. The exit is immediate (`os._exit`): with no front end there is no one to
    answer and nothing to save; the kernel frees the process's memory and devices.
    """

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                logger.warning("the front end (pid %d) is gone; the engine core exits", parent_pid)
                logging.shutdown()
                os._exit(3)
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="heddle-parent-watchdog", daemon=True)
    thread.start()
    return thread


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine core: %(message)s")
    stdin = sys.stdin.buffer
    sys.path[:0] = [entry for entry in pickle.load(stdin) if entry not in sys.path]
    spec = pickle.load(stdin)
    if not isinstance(spec, CoreSpec):
        print("heddle engine core: expected a CoreSpec on stdin", file=sys.stderr)
        return 2
    watch_parent(spec.parent_pid)
    start = time.monotonic()
    logger.debug("starting (pid %d)", os.getpid())
    status = serve(spec)
    logger.debug("exiting after %.1f s", time.monotonic() - start)
    return status


if __name__ == "__main__":
    sys.exit(main())
