"""What a request says about the agent session it belongs to (plain data, no behaviour).

A session is a program of turns that share a growing context: a turn ends (stop, a tool call,
length), the client runs a tool, and the next turn's prompt is the previous context plus the
tool's result. Sub-agents are sessions of their own that name their parent's.
"""

from __future__ import annotations

from dataclasses import dataclass

from heddle.errors import InvalidRequestError

MAX_SESSION_ID_LEN = 256


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    parent_session_id: str | None = None
    expected_pause: float | None = None  # seconds until the next turn: the client's hint
    close: bool = False  # the session's last turn: nothing is parked when it ends
    tool: str | None = None  # what runs after this turn (the pause estimator keys on it)
    # seconds the whole program (its turns and sub-agents) may take from its first turn
    # that names a deadline: the `slo` policy's first-token deadline of every later turn
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("session_id", "parent_session_id"):
            value = getattr(self, name)
            if value is None and name == "parent_session_id":
                continue
            if not isinstance(value, str) or not value or len(value) > MAX_SESSION_ID_LEN:
                raise InvalidRequestError(
                    f"{name} must be a non-empty string of at most {MAX_SESSION_ID_LEN} "
                    "characters",
                    name,
                )
        if self.deadline is not None and not self.deadline > 0:
            raise InvalidRequestError(
                f"program_deadline must be > 0 seconds, got {self.deadline}", "program_deadline"
            )
        if self.expected_pause is not None and not self.expected_pause >= 0:
            raise InvalidRequestError(
                f"expected_pause must be >= 0 seconds, got {self.expected_pause}", "expected_pause"
            )

    @property
    def program_id(self) -> str:
        """The program the session's work counts toward: a sub-agent's parent's, else its own."""
        return self.parent_session_id or self.session_id


def session_info(
    session_id: str | None,
    parent_session_id: str | None = None,
    expected_pause: float | None = None,
    close_session: bool = False,
    tool: str | None = None,
    program_deadline: float | None = None,
) -> SessionInfo | None:
    """A SessionInfo from the API's flat fields; None when no session is named."""
    if session_id is None:
        if (
            parent_session_id is not None
            or expected_pause is not None
            or close_session
            or program_deadline is not None
        ):
            raise InvalidRequestError(
                "parent_session_id, expected_pause, close_session and program_deadline need a "
                "session_id",
                "session_id",
            )
        return None
    return SessionInfo(
        session_id, parent_session_id, expected_pause, bool(close_session), tool,
        program_deadline,
    )
