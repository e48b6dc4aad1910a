"""ClusterEngine: N replicas behind heddle.router, shaped like the AsyncEngine the server uses.

The front end owns what must survive a replica: the prompt, the tokens already streamed, the
detokenizer (and its stop strings) and the request's record. A replica only computes tokens.
When a replica's stream breaks (its process died, its actor was lost) every sequence on it is
placed again by the router, on another replica, with prompt = prompt + the tokens streamed so
far and max_tokens reduced by as many: the client's stream goes on with the next token, none
repeated and none missing, and a greedy stream is the one an uninterrupted run gives.

A request no healthy replica can take gets EngineDeadError (HTTP 503, code
engine_unavailable); one whose replica died waits up to `failover_timeout` for a replica to
come back before it fails the same way. A health loop probes every replica each
`health_interval` seconds: a replica that stops answering is taken out of the rotation, and
one that answers again (Ray restarted it) is taken back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from heddle.cluster.chunks import ReplicaChunk
from heddle.core.outputs import TokenLogprobs
from heddle.engine.async_engine import EngineDeadError, EngineStats, RequestStream, StepListener
from heddle.engine.detokenizer import IncrementalDetokenizer
from heddle.engine.outputs import CompletionOutput, RequestOutput
from heddle.errors import HeddleError, InvalidRequestError, QueueFullError
from heddle.metrics.record import RequestRecord
from heddle.request import SamplingParams
from heddle.router.router import Router
from heddle.router.state import ReplicaReport, RouteRequest

logger = logging.getLogger(__name__)


class ReplicaLost(Exception):
    """The replica behind a stream or a call is gone (process died, actor lost)."""


class ReplicaClient(Protocol):
    """The narrow seam between the front end and one replica (Ray actor or otherwise)."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        hints: dict[str, Any],
    ) -> AsyncIterator[ReplicaChunk]: ...  # raises ReplicaLost

    async def abort(self, request_id: str) -> None: ...

    async def report(self) -> ReplicaReport: ...  # raises ReplicaLost


@dataclass(slots=True)
class FrontFacts:
    """What the server reads of `async_engine.engine` (tokenizer, model name, context)."""

    tokenizer: Any
    max_model_len: int | None
    executor: Any  # has .model_name
    config: Any = None


@dataclass(slots=True)
class _ModelName:
    model_name: str


_ERRORS: dict[str, type[HeddleError]] = {
    "InvalidRequestError": InvalidRequestError,
    "QueueFullError": QueueFullError,
}


@dataclass(slots=True, eq=False)
class _Sequence:
    """One sequence of a client request, across the replicas it ran on."""

    group: _Group
    index: int
    params: SamplingParams  # the client's, for this sequence (n == 1, its own seed)
    detokenizer: IncrementalDetokenizer | None
    record: RequestRecord
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    num_sent_tokens: int = 0
    attempt: int = 0
    replica: int = -1
    stream: AsyncIterator[ReplicaChunk] | None = None
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def engine_request_id(self) -> str:
        base = (
            self.group.request_id
            if len(self.group.sequences) == 1
            else (f"{self.group.request_id}-{self.index}")
        )
        return base if not self.attempt else f"{base}@{self.attempt}"

    def replica_params(self) -> SamplingParams:
        """The client's parameters less what is already done; stop strings stay here."""
        made = len(self.output_token_ids)
        max_tokens = None if self.params.max_tokens is None else self.params.max_tokens - made
        return replace(
            self.params,
            n=1,
            stop=(),
            max_tokens=max_tokens,
            min_tokens=max(0, self.params.min_tokens - made),
            # One draw per sampled token: the resumed stream continues the seeded sequence.
            seed_offset=self.params.seed_offset + made if self.params.seed is not None else 0,
        )

    def route_request(self, session_id: str | None) -> RouteRequest:
        group = self.group
        prompt = [*group.prompt_token_ids, *self.output_token_ids]
        max_tokens = self.params.max_tokens
        remaining = (max_tokens - len(self.output_token_ids)) if max_tokens is not None else 256
        return RouteRequest(
            self.engine_request_id,
            prompt,
            remaining,
            request_class=str(group.hints.get("request_class") or "default"),
            priority=int(group.hints.get("priority") or 0),
            session_id=session_id,
        )

    def completion(self) -> CompletionOutput:
        finished = self.done
        delta_ids = self.output_token_ids[self.num_sent_tokens :]
        self.num_sent_tokens = len(self.output_token_ids)
        text = delta_text = ""
        if self.detokenizer is not None:
            delta_text = self.detokenizer.take_delta(finished)
            text = self.detokenizer.emitted_text
        return CompletionOutput.of(
            self.index,
            text=text,
            token_ids=self.output_token_ids,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=self.logprobs,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            metrics=self.record,
        )


@dataclass(slots=True, eq=False)
class _Group:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    hints: dict[str, Any]
    stream: RequestStream
    session_id: str | None
    sequences: list[_Sequence] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.sequences)


class ClusterEngine:
    """Routes requests over replicas and resumes them when a replica dies."""

    def __init__(
        self,
        clients: list[ReplicaClient],
        router: Router,
        *,
        tokenizer: Any,
        model_name: str,
        max_model_len: int | None,
        health_interval: float = 0.5,
        health_timeout: float = 5.0,
        failover_timeout: float = 60.0,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if len(clients) != len(router.replicas):
            raise HeddleError("one router replica per client")
        self.clients = clients
        self.router = router
        self.tokenizer = tokenizer
        self.engine = FrontFacts(tokenizer, max_model_len, _ModelName(model_name))
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.failover_timeout = failover_timeout
        self._on_stop = on_stop
        self._groups: dict[str, _Group] = {}
        self._listeners: list[StepListener] = []
        self._health_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._stopped = False
        self.stats = EngineStats()
        self.num_failovers = 0  # sequences moved to another replica mid-flight
        self.records: list[RequestRecord] = []
        self.keep_records = False

    # -- what the server uses of an AsyncEngine ---------------------------------------------
    def start(self) -> None:
        if self._health_task is None and not self._stopping:
            with contextlib.suppress(RuntimeError):  # no running loop: started by add_request
                self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def start_async(self) -> None:
        """The EngineClient entry point (heddle/engine/client.py) the app's lifespan calls."""
        self.start()

    @property
    def model_name(self) -> str:
        return str(self.engine.executor.model_name)

    @property
    def max_model_len(self) -> int | None:
        return self.engine.max_model_len

    @property
    def is_running(self) -> bool:
        return not self._stopping

    @property
    def error(self) -> BaseException | None:
        if self._stopping:
            return EngineDeadError("the cluster is shut down")
        if not self.router.healthy():
            return EngineDeadError("no replica is healthy")
        return None

    def add_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def metric_collectors(self) -> list[Any]:
        from heddle.cluster.metrics import ReplicaCollector

        return [ReplicaCollector(self)]

    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        **kwargs: Any,
    ) -> RequestStream:
        """Place every sequence of the request; raises what the engine raises, or
        EngineDeadError when no healthy replica can take it."""
        if self._stopping:
            raise EngineDeadError("the cluster is shutting down")
        self.start()
        if request_id in self._groups:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt = kwargs.pop("prompt", None)
        session_id = kwargs.pop("session_id", None)
        stream = RequestStream(request_id, asyncio.get_running_loop())
        group = _Group(request_id, prompt, list(prompt_token_ids), kwargs, stream, session_id)
        now = time.monotonic()
        for index in range(params.n):
            seq_params = replace(params, n=1)
            if params.n > 1 and params.seed is not None:
                seq_params = replace(seq_params, seed=params.seed + index)
            detokenizer = None
            if self.tokenizer is not None:
                detokenizer = IncrementalDetokenizer(
                    self.tokenizer, group.prompt_token_ids, params.stop, params.skip_special_tokens
                )
            record = RequestRecord(
                request_id=request_id if params.n == 1 else f"{request_id}-{index}",
                arrival_time=now,
                num_prompt_tokens=len(prompt_token_ids),
                request_class=str(kwargs.get("request_class") or "default"),
                user=kwargs.get("user"),
                ttft_slo=kwargs.get("ttft_slo"),
                tpot_slo=kwargs.get("tpot_slo"),
            )
            group.sequences.append(
                _Sequence(
                    group,
                    index,
                    seq_params,
                    detokenizer,
                    record,
                    logprobs=[] if params.logprobs is not None else None,
                )
            )
        placed: list[_Sequence] = []
        try:
            for sequence in group.sequences:
                await self._place(sequence, first=True)
                placed.append(sequence)
        except BaseException:
            for sequence in placed:
                self._abort_on_replica(sequence)
            raise
        self._groups[request_id] = group
        for sequence in group.sequences:
            sequence.task = asyncio.get_running_loop().create_task(self._pump(sequence))
        return stream

    def abort(self, request_id: str) -> None:
        """End a request now (its replica requests are aborted; the stream gets "abort")."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return
        for sequence in group.sequences:
            if not sequence.done:
                sequence.finish_reason = "abort"
                sequence.record.finish_time = time.monotonic()
                sequence.record.finish_reason = "abort"
                self._abort_on_replica(sequence)
            if sequence.task is not None and sequence.task is not asyncio.current_task():
                sequence.task.cancel()
        self._emit(group)
        self._notify(group)

    def abort_all(self) -> None:
        for request_id in list(self._groups):
            self.abort(request_id)

    async def shutdown_async(self, timeout: float | None = 10.0) -> None:
        self._begin_stop()
        await asyncio.to_thread(self._stop_replicas)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        with contextlib.suppress(RuntimeError):
            self._begin_stop()
        self._stop_replicas()

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.abort_all()
        if self._health_task is not None:
            self._health_task.cancel()
        for task in list(self._background):
            task.cancel()

    def _stop_replicas(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._on_stop is not None:
            self._on_stop()

    # -- placing and following a sequence ---------------------------------------------------
    async def _place(self, sequence: _Sequence, first: bool) -> None:
        """Route the sequence and open its stream on a replica (waits for acceptance)."""
        tried: set[int] = set()
        deadline = time.monotonic() + self.failover_timeout
        while True:
            if self._stopping:
                raise EngineDeadError("the cluster is shutting down")
            route = sequence.route_request(sequence.group.session_id)
            replica = self.router.route(route, exclude=tuple(tried))
            if replica is None:
                if first or time.monotonic() > deadline:
                    raise EngineDeadError("no healthy replica can take the request; retry later")
                await asyncio.sleep(self.health_interval)
                tried.clear()
                continue
            client = self.clients[replica]
            stream = client.generate(
                route.request_id,
                list(route.prompt_token_ids),
                sequence.replica_params(),
                sequence.group.hints,
            )
            try:
                accepted = await anext(stream)
            except (ReplicaLost, StopAsyncIteration):
                self._replica_lost(replica)
                tried.add(replica)
                continue
            if accepted.error is not None:
                kind, message, param = accepted.error
                if kind == "QueueFullError" and not first:
                    tried.add(replica)  # resuming: another replica may have room
                    continue
                error_class = _ERRORS.get(kind, HeddleError)
                if error_class is InvalidRequestError:
                    raise InvalidRequestError(message, param)
                raise error_class(message)
            if accepted.report is not None:
                self.router.report(replica, accepted.report)
            sequence.replica = replica
            sequence.stream = stream
            if sequence.record.first_scheduled_time is None:
                sequence.record.first_scheduled_time = time.monotonic()
            return

    async def _pump(self, sequence: _Sequence) -> None:
        try:
            while not sequence.done:
                assert sequence.stream is not None
                try:
                    async for chunk in sequence.stream:
                        self._on_chunk(sequence, chunk)
                        if sequence.done:
                            break
                    if sequence.done:
                        break
                    raise ReplicaLost("the replica's stream ended early")
                except ReplicaLost:
                    if sequence.done:
                        break
                    logger.warning(
                        "replica %d lost; resuming %s after %d tokens",
                        sequence.replica,
                        sequence.engine_request_id,
                        len(sequence.output_token_ids),
                    )
                    self._replica_lost(sequence.replica)
                    sequence.attempt += 1
                    self.num_failovers += 1
                    await self._place(sequence, first=False)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._fail(sequence.group, e)
        finally:
            if sequence.stream is not None:
                # Stop following the replica's stream (it was told to abort if unfinished).
                with contextlib.suppress(Exception):
                    await sequence.stream.aclose()  # type: ignore[attr-defined]

    def _on_chunk(self, sequence: _Sequence, chunk: ReplicaChunk) -> None:
        if chunk.report is not None:
            self.router.report(sequence.replica, chunk.report)
        if sequence.done:
            return
        if chunk.finish_reason == "abort":
            raise ReplicaLost("the replica aborted the request")  # we did not ask it to
        now = time.monotonic()
        record = sequence.record
        if chunk.token_ids:
            if record.first_token_time is None:
                record.first_token_time = now
                sequence.num_cached_tokens = chunk.num_cached_tokens
                record.num_cached_tokens = chunk.num_cached_tokens
            sequence.output_token_ids.extend(chunk.token_ids)
            for _ in chunk.token_ids:
                record.token_times.add_time(now)
            if sequence.logprobs is not None and chunk.logprobs:
                sequence.logprobs.extend(chunk.logprobs)
            detokenizer = sequence.detokenizer
            if detokenizer is not None:
                detokenizer.add_tokens(chunk.token_ids)
                if detokenizer.stop_hit is not None:
                    sequence.finish_reason = "stop"
                    sequence.stop_reason = detokenizer.stop_hit
                    self._abort_on_replica(sequence)
        if chunk.finish_reason is not None and not sequence.done:
            sequence.finish_reason = chunk.finish_reason
            sequence.stop_reason = chunk.stop_reason
        if sequence.done:
            record.finish_time = now
            record.finish_reason = sequence.finish_reason
            self._route_finished(sequence)
        group = sequence.group
        self._emit(group)
        if group.finished and self._groups.get(group.request_id) is group:
            del self._groups[group.request_id]
            self._notify(group)

    def _route_finished(self, sequence: _Sequence) -> None:
        # The replica of the last attempt computed prompt + every token before its own: the
        # whole sequence, which is what the router's prefix index keys by chained hashes.
        self.router.finished(
            RouteRequest(sequence.engine_request_id, sequence.group.prompt_token_ids, 0),
            sequence.replica,
            sequence.output_token_ids,
        )

    def _emit(self, group: _Group) -> None:
        output = RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=[s.completion() for s in group.sequences],
            finished=group.finished,
            num_cached_tokens=group.sequences[0].num_cached_tokens,
        )
        group.stream._put(output)

    def _fail(self, group: _Group, error: Exception) -> None:
        if self._groups.get(group.request_id) is not group:
            return
        del self._groups[group.request_id]
        for sequence in group.sequences:
            if not sequence.done:
                sequence.finish_reason = "error"
                sequence.record.finish_reason = "error"
                self._abort_on_replica(sequence)
            if sequence.task is not None and sequence.task is not asyncio.current_task():
                sequence.task.cancel()
        if not isinstance(error, HeddleError):
            error = EngineDeadError(f"the request failed: {error!r}")
        group.stream._put(error)
        self._notify(group)

    def _notify(self, group: _Group) -> None:
        records = [s.record for s in group.sequences]
        if self.keep_records:
            self.records.extend(records)
        for listener in self._listeners:
            try:
                listener(records, [])
            except Exception:
                logger.exception("a listener failed")

    def _abort_on_replica(self, sequence: _Sequence) -> None:
        if sequence.replica < 0:
            return
        client = self.clients[sequence.replica]
        self._spawn(client.abort(sequence.engine_request_id))

    def _spawn(self, work: Any) -> None:
        async def quietly() -> None:
            with contextlib.suppress(Exception):
                await work

        try:
            task = asyncio.get_running_loop().create_task(quietly())
        except RuntimeError:
            work.close()
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _replica_lost(self, replica: int) -> None:
        if self.router.replicas[replica].healthy:
            logger.warning("replica %d is not answering: out of the rotation", replica)
        self.router.mark_down(replica)
        self._publish_stats()

    # -- health -----------------------------------------------------------------------------
    async def _health_loop(self) -> None:
        while not self._stopping:
            await self.check_health()
            await asyncio.sleep(self.health_interval)

    async def check_health(self) -> None:
        """Probe every replica once: a silent one leaves the rotation, a restarted one joins."""

        async def probe(replica: int) -> None:
            try:
                report = await asyncio.wait_for(self.clients[replica].report(), self.health_timeout)
            except Exception:  # lost, timed out, or its engine loop died
                self._replica_lost(replica)
                return
            state = self.router.replicas[replica]
            if not state.healthy:
                logger.warning("replica %d is healthy again: back in the rotation", replica)
                self.router.mark_up(replica)
            self.router.report(replica, report)

        await asyncio.gather(*(probe(i) for i in range(len(self.clients))))
        self._publish_stats()

    def _publish_stats(self) -> None:
        healthy = self.router.healthy()
        reports = [r.report for r in healthy]
        total = sum(r.kv_blocks_total for r in reports)
        used = sum(r.kv_blocks_used for r in reports)
        self.stats = EngineStats(
            num_running=sum(r.num_running for r in reports),
            num_waiting=sum(r.num_waiting for r in reports),
            num_preemptions_total=sum(r.num_preemptions for r in reports),
            kv_blocks_used=used,
            kv_blocks_free=total - used,
            prefix_cache_hit_rate=(
                sum(r.prefix_hit_rate for r in reports) / len(reports) if reports else 0.0
            ),
            num_steps=sum(r.num_steps for r in reports),
        )
