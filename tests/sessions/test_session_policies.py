"""Session awareness in the existing policies: `fair` charges a program's work to its user,
`slo` gives a program's turns the program's deadline (no model, milliseconds)."""

from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.errors import InvalidRequestError
from heddle.request import Request, SamplingParams
from heddle.sessions.session import SessionInfo, session_info


def _request(rid: str, arrival: float = 0.0, user: str | None = None,
             session: SessionInfo | None = None, seq: int = 0) -> Request:
    request = Request(
        request_id=rid,
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=4),
        arrival_time=arrival,
        user=user,
        session=session,
    )
    request.seq = seq
    return request


def test_fair_charges_a_programs_unnamed_turns_and_sub_agents_to_its_user():
    fair = make_policy("fair")
    first = _request("p-0", user="alice", session=SessionInfo("p"))
    later = _request("p-1", session=SessionInfo("p"))
    child = _request("c-0", session=SessionInfo("c", parent_session_id="p"))
    lone = _request("q-0", session=SessionInfo("q"))
    assert fair.user_of(first) == "alice"
    assert fair.user_of(later) == "alice" and fair.user_of(child) == "alice"
    assert fair.user_of(lone) == "program:q"  # a tenant of its own, not the anonymous crowd
    assert fair.user_of(_request("plain")) == "<anonymous>"


def test_fair_orders_a_heavy_users_next_turn_after_a_light_users_request():
    fair = make_policy("fair")
    fair.user_of(_request("p-0", user="alice", session=SessionInfo("p")))
    fair.counters.update(alice=5000.0, bob=10.0)
    turn = _request("p-1", arrival=0.0, session=SessionInfo("p"), seq=1)  # no user named
    other = _request("b-0", arrival=1.0, user="bob", seq=2)
    assert [r.request_id for r in fair.order_waiting([turn, other], 2.0)] == ["b-0", "p-1"]
    closing = _request("p-2", session=SessionInfo("p", close=True))
    fair.on_finished(closing)  # the program's last turn: its user is forgotten
    assert fair.user_of(_request("p-3", session=SessionInfo("p"))) == "program:p"


def test_slo_turns_inherit_their_programs_deadline():
    slo = make_policy("slo", default_ttft=2.0)
    soon = _request("a-0", arrival=0.0, session=SessionInfo("a", deadline=10.0))
    late = _request("b-0", arrival=0.0, session=SessionInfo("b", deadline=60.0))
    assert slo.deadline(soon, 0.0) == 10.0 and slo.deadline(late, 0.0) == 60.0
    # Later turns name no deadline: they inherit their program's; a sub-agent its parent's.
    a1 = _request("a-1", arrival=4.0, session=SessionInfo("a"), seq=3)
    b1 = _request("b-1", arrival=3.0, session=SessionInfo("b"), seq=4)
    child = _request("k-0", arrival=5.0, session=SessionInfo("k", parent_session_id="b"), seq=5)
    plain = _request("chat", arrival=4.5, seq=6)  # default target: due at 6.5
    order = sorted([b1, child, a1, plain], key=lambda r: slo.sort_key(r, 5.0))
    assert [r.request_id for r in order] == ["chat", "a-1", "b-1", "k-0"]
    assert slo.ttft_target(a1) == pytest.approx(6.0)
    # A turn of a program already past its deadline is lost: moved back, not first.
    overdue = _request("a-2", arrival=12.0, session=SessionInfo("a"), seq=7)
    assert slo.is_lost(overdue, 12.5)
    assert slo.sort_key(overdue, 12.5) > slo.sort_key(_request("chat2", arrival=12.0), 12.5)
    own = _request("a-3", arrival=12.0, session=SessionInfo("a"), seq=8)
    own.ttft_slo = 1.0
    assert slo.deadline(own, 12.0) == 13.0  # a turn's own target wins
    slo.on_finished(_request("a-9", session=SessionInfo("a", close=True)))
    assert slo.program_due(_request("a-10", session=SessionInfo("a"))) is None


def test_a_bad_program_deadline_is_a_clear_error():
    with pytest.raises(InvalidRequestError, match="program_deadline must be > 0"):
        session_info("s", program_deadline=0.0)
    with pytest.raises(InvalidRequestError, match="need a session_id"):
        session_info(None, program_deadline=5.0)
