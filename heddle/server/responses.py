"""Ending a response, however it ends, aborts the engine requests behind it.

A streaming response is cancelled by Starlette when its client disconnects; a non-streaming one
watches for the disconnect itself. Either way every unfinished engine request is aborted, even
one whose output iterator never started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from heddle.engine.async_engine import EngineDeadError, EngineStepError, RequestStream
from heddle.engine.outputs import RequestOutput
from heddle.server.errors import APIError, from_engine_error
from heddle.server.generation import ClientDisconnected, collect, until_disconnect
from heddle.server.state import ServerState

# Status logged for a request whose client left before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


def abort_unfinished(state: ServerState, streams: list[RequestStream]) -> None:
    for stream in streams:
        if not stream.finished:
            state.engine.abort(stream.request_id)


class AbortingStreamingResponse(StreamingResponse):
    """An SSE response that aborts its engine requests when it ends for any reason."""

    def __init__(
        self, content: AsyncIterator[str], state: ServerState, streams: list[RequestStream]
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._state = state
        self._streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            abort_unfinished(self._state, self._streams)


async def run_to_completion(
    raw: Request, state: ServerState, streams: list[RequestStream]
) -> list[RequestOutput]:
    """The final outputs; raises APIError if the engine failed, ClientDisconnected if the
    client left (the requests are aborted in both cases)."""
    try:
        return await until_disconnect(raw, collect(state, streams))
    except EngineStepError as e:
        raise APIError(500, str(e), type="server_error", code="engine_step_failed") from e
    except EngineDeadError as e:
        raise from_engine_error(e) from e
    except ClientDisconnected:
        raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the request") from None
    finally:
        abort_unfinished(state, streams)
