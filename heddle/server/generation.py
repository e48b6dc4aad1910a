"""Submitting prompts to the engine and following their outputs, for both endpoints.

A request may carry several prompts (a batched completion); each becomes an engine request and
their outputs are merged. Whatever ends the following early (a client that disconnects, a
cancelled task, an error) aborts every engine request that has not finished, so its KV blocks
return to the pool at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from heddle.engine.async_engine import EngineStepError, RequestStream
from heddle.engine.outputs import RequestOutput
from heddle.request import SamplingParams
from heddle.server.errors import APIError, error_body, from_engine_error
from heddle.server.state import ServerState

T = TypeVar("T")


@dataclass(slots=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


async def submit(
    state: ServerState,
    request_id: str,
    prompts: list[Prompt],
    params: SamplingParams,
    hints: dict[str, Any],
) -> list[RequestStream]:
    """Add one engine request per prompt; on any error, abort those already added."""
    streams: list[RequestStream] = []
    try:
        for i, prompt in enumerate(prompts):
            engine_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            stream = await state.engine.add_request(
                engine_id, prompt.token_ids, params, prompt=prompt.text, **hints
            )
            streams.append(stream)
        session_id = hints.get("session_id")
        if session_id is not None:  # known to DELETE /v1/sessions/{id} until it is closed
            if hints.get("close_session"):
                state.sessions.closed(session_id)
            else:
                state.sessions.seen(session_id)
    except BaseException as e:
        for stream in streams:
            state.engine.abort(stream.request_id)
        if isinstance(e, Exception):
            raise from_engine_error(e) from e
        raise
    return streams


async def follow(
    state: ServerState, streams: list[RequestStream]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) as they come; aborts unfinished requests when left early."""
    try:
        if len(streams) == 1:
            async for output in streams[0]:
                yield 0, output
        else:
            async for item in _merge(streams):
                yield item
    finally:
        for stream in streams:
            if not stream.finished:
                state.engine.abort(stream.request_id)


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as e:
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def collect(state: ServerState, streams: list[RequestStream]) -> list[RequestOutput]:
    """The final output of each prompt."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    async for index, output in follow(state, streams):
        if output.finished:
            finals[index] = output
    return [f for f in finals if f is not None]


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run `work`; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task in done:
        return task.result()
    raise ClientDisconnected


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def stream_error(error: BaseException) -> str:
    """The SSE event for an error after the 200 went out (the engine failed mid-stream)."""
    if isinstance(error, APIError):
        return sse(error.body())
    if isinstance(error, EngineStepError):
        return sse(error_body(str(error), "server_error", None, "engine_step_failed"))
    return sse(from_engine_error(error if isinstance(error, Exception) else Exception()).body())
