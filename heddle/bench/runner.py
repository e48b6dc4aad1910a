"""The load generator: sends a workload's requests on time (open loop) or at a fixed
concurrency (closed loop) and collects one RequestRecord per request.

Open loop: each request is sent at its arrival time from the workload (Poisson or gamma gaps at
the requested rate), whether or not earlier ones have finished. Closed loop: `concurrency`
requests are in flight at any moment; arrival times are ignored (the workload is generated
all-at-once). Both together: arrivals on schedule, but at most `concurrency` in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from heddle.bench.prompts import prompt_for
from heddle.bench.stream import Outcome, send_request
from heddle.workloads import Workload, WorkloadRequest


@dataclass(slots=True)
class LoadOptions:
    url: str  # the full URL of the completions endpoint
    model: str
    prompt_mode: str = "tokens"
    vocab_size: int = 32000
    concurrency: int | None = None
    max_duration: float | None = None  # seconds; then in-flight requests are cut off
    request_timeout: float | None = 300.0
    temperature: float = 0.0
    extensions: bool = True  # send heddle's fields (priority, request_class, SLOs) when set
    headers: dict[str, str] = field(default_factory=dict)
    # A refused request (HTTP 429) is sent again after its Retry-After, up to this many times
    # (0: never; a refusal is then final). Retries stop at the run's max_duration.
    retry_refused: int = 0


@dataclass(slots=True)
class LoadResult:
    outcomes: list[Outcome]
    num_not_sent: int  # requests whose arrival came after max_duration
    wall_time: float


def payload_for(request: WorkloadRequest, options: LoadOptions) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": options.model,
        "prompt": prompt_for(request, options.prompt_mode, options.vocab_size),
        "max_tokens": request.output_len,
        "ignore_eos": True,
        "temperature": options.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.extensions:
        payload.update(scheduling_extras(request))
    return payload


def scheduling_extras(request: WorkloadRequest, **more: Any) -> dict[str, Any]:
    """heddle's request fields (class, priority, user, SLOs, and `more`) that are set."""
    extras = {
        **more,
        "priority": request.priority or None,
        "request_class": None if request.request_class == "default" else request.request_class,
        "user": request.user,
        "ttft_slo": request.ttft_slo,
        "tpot_slo": request.tpot_slo,
    }
    return {k: v for k, v in extras.items() if v is not None}


def load_client(headers: dict[str, str] | None) -> httpx.AsyncClient:
    """An HTTP client for a load run: unbounded connections, no read timeout (runs bound time)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(None, connect=30.0)
    return httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers, trust_env=False)


async def generate_load(
    workload: Workload,
    options: LoadOptions,
    on_done: Callable[[Outcome], None] | None = None,
) -> LoadResult:
    async with load_client(options.headers) as client:
        return await _Driver(client, workload, options, on_done).run()


class _Driver:
    def __init__(
        self,
        client: httpx.AsyncClient,
        workload: Workload,
        options: LoadOptions,
        on_done: Callable[[Outcome], None] | None,
    ) -> None:
        self.client = client
        self.workload = workload
        self.options = options
        self.on_done = on_done
        self.outcomes: list[Outcome] = []
        self.num_not_sent = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.seats = asyncio.Semaphore(options.concurrency) if options.concurrency else None
        self.t0 = 0.0
        self.deadline: float | None = None

    async def run(self) -> LoadResult:
        self.t0 = time.perf_counter()
        if self.options.max_duration is not None:
            self.deadline = self.t0 + self.options.max_duration
        for request in self.workload.requests:
            self._spawn(request)
        while self.tasks:
            await asyncio.wait(set(self.tasks))
        return LoadResult(self.outcomes, self.num_not_sent, time.perf_counter() - self.t0)

    def _spawn(self, request: WorkloadRequest) -> None:
        task = asyncio.create_task(self._at_arrival(request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _attempt(self, request: WorkloadRequest, payload: dict[str, Any]) -> Outcome:
        return await send_request(
            self.client,
            self.options.url,
            payload,
            request,
            self.t0,
            self.options.request_timeout,
            self.deadline,
        )

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    async def _at_arrival(self, request: WorkloadRequest) -> None:
        # Closed loop without a rate: every arrival time is 0 and the seats set the pace.
        arrival = self.t0 + request.arrival_time
        if self.deadline is not None and arrival >= self.deadline:
            self.num_not_sent += 1
            return
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.seats is None:
            await self._send(request)
            return
        async with self.seats:
            await self._send(request)

    async def _send(self, request: WorkloadRequest) -> None:
        if self._past_deadline():
            self.num_not_sent += 1
            return
        payload = payload_for(request, self.options)
        outcome = await self._attempt(request, payload)
        first_sent = outcome.record.arrival_time
        num_refusals = outcome.num_refusals
        retry_after = outcome.retry_after
        while outcome.refused and num_refusals <= self.options.retry_refused:
            wait = 1.0 if outcome.retry_after is None else outcome.retry_after
            if self.deadline is not None and time.perf_counter() + wait >= self.deadline:
                break
            await asyncio.sleep(wait)
            outcome = await self._attempt(request, payload)
            num_refusals += outcome.num_refusals
            retry_after = outcome.retry_after if outcome.refused else retry_after
        if num_refusals:
            # The user's latency runs from the first attempt: a retried request's TTFT
            # includes the time it spent refused.
            outcome.num_refusals = num_refusals
            outcome.retry_after = retry_after
            outcome.first_sent = first_sent
            outcome.record.arrival_time = first_sent
        self.outcomes.append(outcome)
        if self.on_done is not None:
            self.on_done(outcome)
        if self.workload.is_agent and outcome.error is None:
            finish = outcome.record.finish_time or 0.0
            vocab = self.options.vocab_size if self.options.prompt_mode == "tokens" else None
            follow_up = self.workload.next_request(request, finish, vocab_size=vocab)
            if follow_up is not None:
                self._spawn(follow_up)
