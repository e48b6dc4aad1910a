from __future__ import annotations

import pytest

from heddle.errors import HeddleError
from heddle.workloads import AgentCall, AgentProgram, agent, get_workload


def make_program() -> AgentProgram:
    calls = (AgentCall(10, 4, 1.5), AgentCall(3, 5, 0.5), AgentCall(2, 6, 0.0))
    return AgentProgram("p", 2.0, calls, seed="s")


def test_lengths_extend_context() -> None:
    program = make_program()
    first = program.first_request()
    assert (first.request_id, first.arrival_time, first.prompt_len, first.output_len) == (
        "p.0",
        2.0,
        10,
        4,
    )
    second = program.next_request(first, finish_time=3.0)
    assert second is not None
    assert (second.request_id, second.call_index, second.prompt_len, second.output_len) == (
        "p.1",
        1,
        10 + 4 + 3,
        5,
    )
    assert second.arrival_time == 3.0 + 1.5
    assert second.prompt_token_ids is None
    third = program.next_request(second, finish_time=7.0)
    assert third is not None
    assert (third.prompt_len, third.arrival_time) == (17 + 5 + 2, 7.5)
    assert program.next_request(third, finish_time=9.0) is None
    assert [program.planned_prompt_len(k) for k in range(3)] == [10, 17, 24]


def test_ids_extend_context_with_real_outputs() -> None:
    program = make_program()
    first = program.first_request()
    prompt = first.prompt_ids(1000)
    second = program.next_request(first, 3.0, vocab_size=1000, output_token_ids=[7, 8])
    assert second is not None and second.prompt_token_ids is not None
    # prompt + the 2 generated tokens + 3 tool tokens
    assert second.prompt_len == 10 + 2 + 3
    assert second.prompt_token_ids[:12] == (*prompt, 7, 8)
    third = program.next_request(second, 5.0, vocab_size=1000)
    assert third is not None and third.prompt_token_ids is not None
    assert third.prompt_token_ids[:15] == second.prompt_token_ids
    assert third.prompt_len == 15 + 5 + 2
    # Deterministic: the same inputs give the same ids.
    again = program.next_request(first, 3.0, vocab_size=1000, output_token_ids=[7, 8])
    assert again == second


def test_slos_and_user_carry_over() -> None:
    w = get_workload("agent", num_requests=2, ttft_slo=0.3, tpot_slo=0.05)
    first = w.requests[0]
    nxt = w.next_request(first, 1.0)
    assert nxt is not None and (nxt.ttft_slo, nxt.tpot_slo) == (0.3, 0.05)
    assert nxt.program_id == first.program_id


def test_workload_drives_programs_and_flat_view() -> None:
    w = get_workload("agent", seed=1, num_requests=10, rate=1.0, min_calls=3, max_calls=3)
    assert w.is_agent and len(w.programs) == 10 and len(w) == 10
    assert all(r.call_index == 0 for r in w.requests)
    flat = w.flat()
    assert len(flat) == 30
    assert [r.arrival_time for r in flat] == sorted(r.arrival_time for r in flat)
    program = w.programs[0]
    calls = [r for r in flat if r.program_id == program.program_id]
    assert [c.prompt_len for c in calls] == [program.planned_prompt_len(k) for k in range(3)]
    assert w.describe()["num_requests"] == 30
    # Driving the programs with zero-time calls reproduces the flat view.
    driven = []
    for first in w.requests:
        r = first
        while r is not None:
            driven.append(r)
            r = w.next_request(r, r.arrival_time)
    assert sorted((r.request_id, r.arrival_time, r.prompt_len) for r in driven) == sorted(
        (r.request_id, r.arrival_time, r.prompt_len) for r in flat
    )


def test_non_agent_request_causes_nothing() -> None:
    w = get_workload("chat", num_requests=2)
    assert w.next_request(w.requests[0], 1.0) is None


def test_context_cap_and_validation() -> None:
    programs = agent(num_requests=50, max_calls=10, min_calls=10, max_context_len=2000)
    for p in programs:
        assert (
            p.planned_prompt_len(len(p.calls) - 1) + p.calls[-1].output_len <= 2000
            or len(p.calls) == 1
        )
    with pytest.raises(HeddleError, match="min_calls"):
        agent(min_calls=3, max_calls=2)
    with pytest.raises(HeddleError, match="belongs to program"):
        make_program().next_request(programs[0].first_request(), 1.0)
