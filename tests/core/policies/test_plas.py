"""plas: program-level least attained service (Autellix)."""

from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.errors import HeddleError
from heddle.sessions.session import SessionInfo
from tests.factories import create_request, create_scheduler, sample_all


def _call(request_id, session=None, parent=None, arrival=0.0, prompt_len=8, **kwargs):
    info = SessionInfo(session, parent) if session is not None else None
    return create_request(
        request_id, prompt_len=prompt_len, arrival_time=arrival, session=info, **kwargs
    )


def ids(requests):
    return [r.request_id for r in requests]


def test_service_counts_every_turn_of_a_program_and_its_subagents():
    policy = make_policy("plas", quantum=100, output_weight=2)
    first = _call("p-0", "p", prompt_len=40)
    first.num_computed_tokens = 40
    first.all_token_ids.extend([5] * 10)  # 10 generated
    assert policy.call_service(first) == 40 + 2 * 10
    policy.on_finished(first)
    child = _call("c-0", "c", parent="p", prompt_len=8)
    assert policy.program_of(child) == "p"
    assert policy.attained(child) == 60.0
    policy.on_finished(child)  # computed nothing: adds 0
    grandchild = _call("g-0", "g", parent="c")
    assert policy.program_of(grandchild) == "p"


def test_programs_with_less_service_go_first_then_by_program_arrival():
    policy = make_policy("plas", quantum=100)
    policy.service.update({"old": 5000.0, "young": 10.0})
    policy._arrival.update({"old": 0.0, "young": 9.0})
    waiting = [
        _call("old-7", "old", arrival=10.0),
        _call("young-1", "young", arrival=11.0),
        _call("lone", None, arrival=10.5),  # a request without a session: a program of one
    ]
    assert ids(policy.order_waiting(waiting, now=12.0)) == ["young-1", "lone", "old-7"]
    # Same level: the program that arrived first goes first, whatever its call's arrival.
    policy.service["old"] = 20.0
    assert ids(policy.order_waiting(waiting, now=12.0)) == ["old-7", "young-1", "lone"]
    # The most served program's call is the preemption victim.
    policy.service["old"] = 5000.0
    assert policy.choose_victim(waiting, now=12.0).request_id == "old-7"


def test_levels_double_and_a_starving_call_is_lifted():
    policy = make_policy("plas", quantum=100, num_levels=4, starvation_seconds=30)
    assert [policy.level(s) for s in (0, 99, 100, 199, 200, 400, 10**9)] == [0, 0, 1, 1, 2, 3, 3]
    policy.service.update({"big": 10**6, "small": 0.0})
    starving = _call("big-3", "big", arrival=0.0)
    fresh = _call("small-0", "small", arrival=29.0)
    assert ids(policy.order_waiting([starving, fresh], now=29.0)) == ["small-0", "big-3"]
    assert ids(policy.order_waiting([starving, fresh], now=31.0)) == ["big-3", "small-0"]


def test_closing_the_root_session_forgets_the_program():
    policy = make_policy("plas")
    policy.on_finished(_call("p-0", "p"))
    last = create_request("p-1", session=SessionInfo("p", close=True))
    policy.on_finished(last)
    assert "p" not in policy.service and "p" not in policy._arrival


def test_in_the_scheduler_a_new_program_overtakes_a_long_one():
    sched = create_scheduler(policy="plas", max_num_batched_tokens=16, max_num_seqs=1, quantum=16)
    long_turn = _call("long-0", "long", prompt_len=12, max_tokens=2, arrival=0.0)
    sched.add_request(long_turn)
    while sched.requests:
        out = sched.schedule()
        sched.update(out, sample_all(out))
    # The long program's next turn and a new program's first arrive together.
    sched.add_request(_call("long-1", "long", prompt_len=14, max_tokens=2, arrival=1.0))
    new = _call("new-0", "new", prompt_len=8, max_tokens=2, arrival=2.0, first_token=500)
    sched.add_request(new)
    out = sched.schedule()
    assert out.request_ids == ["new-0"]


def test_bad_options():
    with pytest.raises(HeddleError, match="bad options"):
        make_policy("plas", quantum=0)
    with pytest.raises(HeddleError, match="bad options"):
        make_policy("plas", starvation_seconds=-1)
