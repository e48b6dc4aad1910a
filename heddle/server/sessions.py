"""`DELETE /v1/sessions/{session_id}`: close an agent session (heddle/sessions).

The same as sending `close_session` on a session's last turn, for a client that learns only
after the turn that the program is over (or gives up): the engine frees the session's parked KV
before its next step, and a turn still in flight parks nothing when it ends. The answer is
OpenAI's delete shape, `{"id": ..., "object": "session", "deleted": true}`; a session this
server never saw a turn of (or already closed) is a 404 with an OpenAI-style error body.

The server remembers the sessions it has seen turns of (`KnownSessions`, bounded: the least
recently used are forgotten first), so the answer needs no round trip to an engine core in
another process; the close itself is a command like an abort.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse

from heddle.server.errors import APIError

if TYPE_CHECKING:
    from heddle.server.state import ServerState

MAX_KNOWN_SESSIONS = 100_000


class KnownSessions:
    """Session ids this server has seen turns of and not seen closed, least recent first."""

    def __init__(self, limit: int = MAX_KNOWN_SESSIONS) -> None:
        if limit < 1:
            raise ValueError("the known-sessions bound must be positive")
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, session_id: str) -> None:
        self._ids[session_id] = None
        self._ids.move_to_end(session_id)
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def closed(self, session_id: str) -> bool:
        """Forget a session; False if it was not known."""
        return self._ids.pop(session_id, 0) is None

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


async def close_session(session_id: str, raw: Request) -> JSONResponse:
    state: ServerState = raw.app.state.heddle
    close = getattr(state.engine, "close_session", None)
    if close is None:
        raise APIError(
            501,
            "this server's engine cannot close sessions by id; send close_session on the "
            "session's last turn",
            param="session_id",
            code="not_implemented",
        )
    if not state.sessions.closed(session_id):
        raise APIError(
            404,
            f"no session {session_id!r}: this server has seen no open session by that id",
            param="session_id",
            code="session_not_found",
        )
    close(session_id)
    return JSONResponse({"id": session_id, "object": "session", "deleted": True})
