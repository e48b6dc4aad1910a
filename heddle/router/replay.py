"""N engines on one virtual clock behind a Router: the multi-replica simulator.

Each replica is the real Engine (scheduler, KV cache, policy) over a SimulatedExecutor with its
own VirtualClock; the loop keeps every clock on one timeline by always taking the earliest
event. Events, and their order when times tie:

    publish   a replica's step ended: its report reaches the router, its finished requests
              reach their clients (agent follow-ups are scheduled from here)
    failure   a replica dies: its in-flight requests resume elsewhere from the tokens delivered
    restart   the replica is back (empty cache), the router takes it again
    arrival   a request (new, an agent's next call, or a resumed one) is routed and queued
    step      an idle replica with work starts a step (arrivals at the same time join it)

A step is computed when it starts and published when it ends, so the router only ever sees a
replica's state as of its last finished step, as it would in a deployment. A request in flight
on a replica that dies keeps the tokens whose step ended before the failure; the rest of its
output is generated on another replica from prompt + those tokens (no token lost or repeated).
With one replica and no failures this is the same schedule as heddle.engine.replay.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.engine.engine import Engine
from heddle.engine.outputs import RequestOutput
from heddle.errors import HeddleError
from heddle.metrics.record import RequestRecord, TokenTimes
from heddle.request import SamplingParams
from heddle.router.report import engine_report
from heddle.router.router import Router
from heddle.router.state import RouteRequest
from heddle.workloads import AgentRun, TokenContexts, Workload, WorkloadRequest

_PUBLISH, _FAILURE, _RESTART, _ARRIVAL, _STEP = range(5)


@dataclass(frozen=True, slots=True)
class ReplicaFailure:
    """Replica `replica_id` dies at `time` (seconds from the start); back after
    `restart_after` seconds with an empty cache (None: never)."""

    replica_id: int
    time: float
    restart_after: float | None = 10.0

    @classmethod
    def parse(cls, spec: str) -> ReplicaFailure:
        """ "REPLICA@TIME" or "REPLICA@TIME+RESTART" or "REPLICA@TIME+never"."""
        try:
            replica, _, rest = spec.partition("@")
            when, _, restart = rest.partition("+")
            restart_after: float | None = 10.0
            if restart == "never":
                restart_after = None
            elif restart:
                restart_after = float(restart)
            failure = cls(int(replica), float(when), restart_after)
        except ValueError:
            raise HeddleError(
                f"a failure is REPLICA@TIME[+RESTART_SECONDS|+never], got {spec!r}"
            ) from None
        if failure.time < 0 or (failure.restart_after is not None and failure.restart_after < 0):
            raise HeddleError(f"failure times must be >= 0, got {spec!r}")
        return failure


@dataclass(slots=True)
class ReplicaSummary:
    replica_id: int
    num_routed: int = 0
    num_steps: int = 0
    busy_time: float = 0.0  # seconds of steps
    num_preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in its prefix cache
    prefix_hits: int = 0
    num_failures: int = 0


@dataclass(slots=True)
class ClusterResult:
    records: list[RequestRecord]  # one per client request; resumed attempts merged
    replicas: list[ReplicaSummary]
    router: str
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (request id, reason)
    elapsed: float = 0.0
    wall_seconds: float = 0.0
    num_resumed: int = 0  # requests moved off a failed replica mid-flight
    num_lost_tokens: int = 0  # tokens a failure destroyed (must stay 0)

    @property
    def num_steps(self) -> int:
        return sum(r.num_steps for r in self.replicas)

    @property
    def prefix_hit_rate(self) -> float:
        queries = sum(r.prefix_queries for r in self.replicas)
        return sum(r.prefix_hits for r in self.replicas) / queries if queries else 0.0


@dataclass(slots=True, eq=False)
class _Flight:
    """A client request across its attempts."""

    request: WorkloadRequest
    prompt_ids: list[int]
    arrival: float
    delivered: list[int] = field(default_factory=list)  # tokens of attempts that died
    delivered_times: list[float] = field(default_factory=list)
    dead_records: list[RequestRecord] = field(default_factory=list)
    attempt: int = 0
    replica: int = -1
    engine_request_id: str = ""
    route: RouteRequest | None = None


def session_of(request: WorkloadRequest) -> str | None:
    """The affinity key of a workload request: its session, or else its agent program."""
    return getattr(request, "session_id", None) or request.program_id


def replay_cluster(
    make_engine: Callable[[int], Engine],
    num_replicas: int,
    router: Router,
    workload: Workload,
    *,
    vocab_size: int,
    failures: Sequence[ReplicaFailure] = (),
    temperature: float = 0.0,
) -> ClusterResult:
    """Run `workload` through `num_replicas` engines (`make_engine(i)`, each on its own
    VirtualClock starting at 0) behind `router`."""
    return _ClusterLoop(make_engine, num_replicas, router, workload, vocab_size, temperature).run(
        failures
    )


class _ClusterLoop:
    def __init__(
        self,
        make_engine: Callable[[int], Engine],
        num_replicas: int,
        router: Router,
        workload: Workload,
        vocab_size: int,
        temperature: float,
    ) -> None:
        if len(router.replicas) != num_replicas:
            raise HeddleError(
                f"the router knows {len(router.replicas)} replicas, the cluster has {num_replicas}"
            )
        self.make_engine = make_engine
        self.router = router
        self.workload = workload
        self.vocab_size = vocab_size
        # Agent programs: a finished call causes the next ones (after a tool, or a fan-out/join).
        self.agents = AgentRun(workload, TokenContexts(vocab_size)) if workload.is_agent else None
        self.temperature = temperature
        self.engines = [make_engine(i) for i in range(num_replicas)]
        self.alive = [True] * num_replicas
        self.epoch = [0] * num_replicas
        self.busy = [False] * num_replicas  # a step or its publish is pending
        self.num_received = [0] * num_replicas
        self.unpublished: list[dict[str, RequestOutput]] = [{} for _ in range(num_replicas)]
        self.flights: dict[str, _Flight] = {}  # engine request id -> flight
        self.summaries = [ReplicaSummary(i) for i in range(num_replicas)]
        self.retired: list[tuple[int, Engine]] = []
        self.result = ClusterResult(records=[], replicas=self.summaries, router=router.name)
        self.events: list[tuple[float, int, int, Any]] = []
        self._order = 0

    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.events, (t, kind, self._order, payload))
        self._order += 1

    def run(self, failures: Sequence[ReplicaFailure]) -> ClusterResult:
        wall_start = time.perf_counter()
        first = self.agents.first_requests() if self.agents else self.workload.requests
        for request in first:
            self._push(request.arrival_time, _ARRIVAL, request)
        for failure in failures:
            if not 0 <= failure.replica_id < len(self.engines):
                raise HeddleError(
                    f"cannot fail replica {failure.replica_id}: there are {len(self.engines)}"
                )
            self._push(failure.time, _FAILURE, failure)
        now = 0.0
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self._arrive(payload, now)
            elif kind == _STEP:
                self._step(payload[0], payload[1], now)
            elif kind == _PUBLISH:
                self._publish(payload, now)
            elif kind == _FAILURE:
                self._fail(payload, now)
            else:
                self._restart(payload, now)
        self._finish(now, wall_start)
        return self.result

    # -- requests in ------------------------------------------------------------------------
    def _arrive(self, item: WorkloadRequest | _Flight, now: float) -> None:
        if isinstance(item, _Flight):
            flight = item
        else:
            ids = self.agents.context_of(item) if self.agents else item.prompt_ids(self.vocab_size)
            flight = _Flight(item, list(ids), now)
        request = flight.request
        prompt = flight.prompt_ids + flight.delivered
        remaining = request.output_len - len(flight.delivered)
        route = RouteRequest(
            request.request_id,
            prompt,
            remaining,
            request_class=request.request_class,
            priority=request.priority,
            session_id=session_of(request),
        )
        replica = self.router.route(route)
        if replica is None:
            self.result.rejected.append((request.request_id, "no healthy replica (503)"))
            return
        engine_id = (
            request.request_id if not flight.attempt else f"{request.request_id}@{flight.attempt}"
        )
        try:
            self.engines[replica].add_request(
                engine_id,
                prompt,
                SamplingParams(max_tokens=remaining, temperature=self.temperature, ignore_eos=True),
                arrival_time=now,
                priority=request.priority,
                user=request.user,
                request_class=request.request_class,
                ttft_slo=request.ttft_slo,
                tpot_slo=request.tpot_slo,
                true_output_len=remaining,
            )
        except HeddleError as exc:
            self.result.rejected.append((request.request_id, str(exc)))
            return
        self.num_received[replica] += 1
        self.summaries[replica].num_routed += 1
        flight.replica, flight.engine_request_id, flight.route = replica, engine_id, route
        self.flights[engine_id] = flight
        if not self.busy[replica]:
            self.busy[replica] = True
            self._push(now, _STEP, (replica, self.epoch[replica]))

    # -- steps ------------------------------------------------------------------------------
    def _step(self, replica: int, epoch: int, now: float) -> None:
        if epoch != self.epoch[replica]:
            return
        engine = self.engines[replica]
        clock: Any = engine.clock
        if clock.now() < now:
            clock.advance_to(now)
        steps_before = engine.num_steps
        outputs = engine.step()
        if engine.num_steps == steps_before:
            self.busy[replica] = False  # nothing can run; the next arrival wakes it
            return
        end = clock.now()
        summary = self.summaries[replica]
        summary.num_steps += 1
        summary.busy_time += end - now
        finished = {o.request_id: o for o in outputs if o.finished}
        self.unpublished[replica] = finished
        report = engine_report(engine, self.num_received[replica], end)
        self._push(end, _PUBLISH, (replica, epoch, finished, report))

    def _publish(self, payload: tuple[int, int, dict[str, RequestOutput], Any], now: float) -> None:
        replica, epoch, finished, report = payload
        if epoch != self.epoch[replica]:
            return
        self.unpublished[replica] = {}
        self.router.report(replica, report)
        for output in finished.values():
            self._complete(self.flights.pop(output.request_id), output)
        if self.engines[replica].has_unfinished_requests():
            self._push(now, _STEP, (replica, epoch))
        else:
            self.busy[replica] = False

    def _complete(self, flight: _Flight, output: RequestOutput) -> None:
        record = output.metrics
        assert record is not None and flight.route is not None
        tokens = output.outputs[0].token_ids
        self.router.finished(flight.route, flight.replica, tokens)
        merged = _merge(flight, record)
        # With ignore_eos every request generates exactly output_len tokens across its attempts.
        self.result.num_lost_tokens += abs(
            flight.request.output_len - len(flight.delivered) - len(tokens)
        )
        self.result.records.append(merged)
        if self.agents is not None and merged.finish_time is not None:
            generated = [*flight.delivered, *tokens]
            for follow_up in self.agents.finished(flight.request, merged.finish_time, generated):
                self._push(follow_up.arrival_time, _ARRIVAL, follow_up)

    # -- failures ---------------------------------------------------------------------------
    def _fail(self, failure: ReplicaFailure, now: float) -> None:
        replica = failure.replica_id
        if not self.alive[replica]:
            return
        self.alive[replica] = False
        self.epoch[replica] += 1
        self.busy[replica] = False
        self.router.mark_down(replica)
        self.summaries[replica].num_failures += 1
        engine = self.engines[replica]
        unpublished = self.unpublished[replica]
        self.unpublished[replica] = {}
        victims = [f for f in self.flights.values() if f.replica == replica]
        for flight in victims:
            del self.flights[flight.engine_request_id]
            tokens, record = _progress(engine, unpublished, flight.engine_request_id)
            # Tokens whose step ended after the failure never reached the client.
            times = list(record.token_times)
            delivered = bisect.bisect_right(times, now)
            flight.delivered.extend(tokens[:delivered])
            flight.delivered_times.extend(times[:delivered])
            flight.dead_records.append(record)
            flight.attempt += 1
            self.result.num_resumed += 1
            self._push(now, _ARRIVAL, flight)
        self.retired.append((replica, engine))
        if failure.restart_after is not None:
            self._push(now + failure.restart_after, _RESTART, replica)

    def _restart(self, replica: int, now: float) -> None:
        engine = self.make_engine(replica)
        clock: Any = engine.clock
        clock.advance_to(now)
        self.engines[replica] = engine
        self.num_received[replica] = 0
        self.alive[replica] = True
        self.router.mark_up(replica)

    def _finish(self, now: float, wall_start: float) -> None:
        result = self.result
        for replica, engine in self.retired:
            self._account(replica, engine)
        for replica, engine in enumerate(self.engines):
            self._account(replica, engine)
            engine.check_integrity()
        result.elapsed = max((r.finish_time or 0.0 for r in result.records), default=0.0)
        result.wall_seconds = time.perf_counter() - wall_start
        if self.flights:
            raise RuntimeError(f"{len(self.flights)} requests never finished")

    def _account(self, replica: int, engine: Engine) -> None:
        summary = self.summaries[replica]
        summary.num_preemptions += engine.scheduler.num_preemptions
        summary.prefix_queries += engine.kv_cache.prefix_queries
        summary.prefix_hits += engine.kv_cache.prefix_hits


def _progress(
    engine: Engine, unpublished: dict[str, RequestOutput], engine_request_id: str
) -> tuple[list[int], RequestRecord]:
    """Output tokens and record of a request on a dead engine (finished or not)."""
    output = unpublished.get(engine_request_id)
    if output is not None:
        assert output.metrics is not None
        return list(output.outputs[0].token_ids), output.metrics
    request = engine.scheduler.requests[engine_request_id]
    return list(request.output_token_ids), request.record


def _merge(flight: _Flight, last: RequestRecord) -> RequestRecord:
    """The client's record of a request: its first attempt's arrival, every delivered token."""
    if not flight.dead_records:
        return last
    first = flight.dead_records[0]
    attempts = [*flight.dead_records, last]
    merged = RequestRecord(
        request_id=flight.request.request_id,
        arrival_time=flight.arrival,
        num_prompt_tokens=len(flight.prompt_ids),
        request_class=first.request_class,
        user=first.user,
        ttft_slo=first.ttft_slo,
        tpot_slo=first.tpot_slo,
    )
    merged.token_times = TokenTimes.of([*flight.delivered_times, *last.token_times])
    merged.first_token_time = merged.token_times[0] if merged.token_times else None
    merged.first_scheduled_time = next(
        (a.first_scheduled_time for a in attempts if a.first_scheduled_time is not None), None
    )
    merged.finish_time = last.finish_time
    merged.finish_reason = last.finish_reason
    merged.num_cached_tokens = first.num_cached_tokens
    for attempt in attempts:
        merged.num_preemptions += attempt.num_preemptions
        merged.stall_time += attempt.stall_time
        merged.blocked_by_longer_time += attempt.blocked_by_longer_time
        merged.num_steps += attempt.num_steps
        merged.step_utilization_sum += attempt.step_utilization_sum
    return merged
