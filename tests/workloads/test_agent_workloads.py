"""The agent workloads' shapes (against the statistics they cite) and AgentRun's driving."""

from __future__ import annotations

import math
import statistics

import pytest

from heddle.errors import HeddleError
from heddle.workloads import (
    SUBAGENTS,
    USER_TURN,
    AgentCall,
    AgentProgram,
    AgentRun,
    TokenContexts,
    Workload,
    bfcl_agent,
    fanout_agent,
    get_workload,
    swe_agent,
)

VOCAB = 1000


def test_swe_programs_match_their_sources() -> None:
    programs = swe_agent(seed=0, num_requests=1500)
    turns = [len(p.calls) for p in programs]
    assert statistics.mean(turns) == pytest.approx(11, rel=0.1)  # Continuum's SWE-bench traces
    assert max(turns) > 30  # a long right tail
    final = [p.planned_prompt_len(len(p.calls) - 1) + p.calls[-1].output_len for p in programs]
    assert 8_000 < statistics.mean(final) < 20_000  # mostly under 20k tokens ...
    assert sum(f > 30_000 for f in final) > 0.03 * len(final)  # ... tens of thousands in the tail
    pauses = sorted(c.tool_latency_after for p in programs for c in p.calls[:-1])
    assert 1.0 < statistics.mean(pauses) < 3.0  # seconds, on average
    assert statistics.median(pauses) < 0.2  # most commands are quick reads
    assert pauses[int(0.99 * len(pauses))] > 10.0  # a heavy tail (test suites)
    tools = {c.tool for p in programs for c in p.calls}
    assert tools == {"bash:read", "bash:edit", "bash:run", "bash:test"}
    # Every program opens with the same system prompt (a prefix the cache can share).
    assert len({p.shared_prefix for p in programs}) == 1


def test_bfcl_programs_match_the_dataset_histograms() -> None:
    programs = bfcl_agent(seed=0, num_requests=3000)
    user_turns = [sum(c.tool == USER_TURN for c in p.calls) for p in programs]
    api_calls = [sum(c.tool == "api" for c in p.calls) for p in programs]
    assert statistics.mean(user_turns) == pytest.approx(3.67, rel=0.05)
    assert statistics.mean(api_calls) == pytest.approx(5.71, rel=0.1)
    assert statistics.mean(len(p.calls) for p in programs) == pytest.approx(9.4, rel=0.1)
    assert all(p.calls[-1].tool == USER_TURN for p in programs)
    # Programs that involve the same API classes share their whole function-doc prefix.
    by_prefix: dict[tuple[tuple[str, int], ...], int] = {}
    for p in programs:
        by_prefix[p.shared_prefix] = by_prefix.get(p.shared_prefix, 0) + 1
    assert len(by_prefix) <= 8 + 28 and max(by_prefix.values()) > 50
    docs = [sum(n for _, n in p.shared_prefix) for p in programs]
    assert 4_000 < statistics.mean(docs) < 6_500  # ~20.7k characters of docs per conversation


def test_fanout_programs_spawn_parallel_subagents() -> None:
    programs = fanout_agent(seed=0, num_requests=200)
    for p in programs:
        fans = [c for c in p.calls if c.tool == SUBAGENTS]
        assert 1 <= len(fans) <= 2 and not p.calls[-1].subagents
        for call in fans:
            assert 2 <= len(call.subagents) <= 5
            for child in call.subagents:
                assert child.parent_id == p.program_id and child.root_id == p.program_id
                assert 2 <= len(child.calls) <= 4
    assert any(len([c for c in p.calls if c.subagents]) == 2 for p in programs)
    assert statistics.mean(p.num_calls() for p in programs) > 10


def test_tool_time_factor_slows_tools_not_the_announced_pause() -> None:
    base = swe_agent(seed=2, num_requests=5)
    slow = swe_agent(seed=2, num_requests=5, tool_time_factor=10.0)
    for a, b in zip(base, slow, strict=True):
        for ca, cb in zip(a.calls, b.calls, strict=True):
            assert cb.tool_latency_after == pytest.approx(10 * ca.tool_latency_after)
            assert cb.expected_pause == ca.expected_pause
            assert (ca.prompt_extra_len, ca.output_len) == (cb.prompt_extra_len, cb.output_len)


def test_tool_sigma_scale_stretches_the_tail_at_the_same_median() -> None:
    base = swe_agent(seed=3, num_requests=40)
    heavy = swe_agent(seed=3, num_requests=40, tool_sigma_scale=1.5)
    pairs = [(ca, cb) for a, b in zip(base, heavy, strict=True)
             for ca, cb in zip(a.calls, b.calls, strict=True)]
    assert len(pairs) > 200
    for ca, cb in pairs:  # the same programs and draws: only the distance from the median grows
        assert (ca.prompt_extra_len, ca.output_len, ca.tool) == (cb.prompt_extra_len, cb.output_len,
                                                                 cb.tool)
        assert cb.expected_pause > ca.expected_pause
    tests = [(ca.tool_latency_after, cb.tool_latency_after) for ca, cb in pairs
             if ca.tool == "bash:test"]
    assert max(b for _, b in tests) > 1.5 * max(a for a, _ in tests)
    for a, b in tests:  # the same normal draw z: 6 s * exp(1.5 * 1.2 z) against 6 s * exp(1.2 z)
        assert math.log(b / 6.0) == pytest.approx(1.5 * math.log(a / 6.0), abs=1e-9)
    with pytest.raises(HeddleError, match="tool_sigma_scale"):
        swe_agent(num_requests=2, tool_sigma_scale=0.0)


def _fanout_workload() -> Workload:
    children = tuple(
        AgentProgram(
            f"p/s{j}",
            0.0,
            (AgentCall(3, 2, 0.5, "web", 0.5), AgentCall(2, 1 + j, 0.0, "none")),
            seed=f"c{j}",
            parent_id="p",
        )
        for j in range(2)
    )
    program = AgentProgram(
        "p",
        1.0,
        (AgentCall(8, 2, 0.25, SUBAGENTS, 1.0, children), AgentCall(4, 3, 0.0, "none")),
        seed="root",
    )
    return Workload("handmade", {}, 0, [program.first_request()], [program])


def test_agent_run_forks_and_joins_with_shared_prefixes() -> None:
    run = AgentRun(_fanout_workload(), TokenContexts(VOCAB))
    (first,) = run.first_requests()
    prompt = run.context_of(first)
    assert len(prompt) == 8
    children = run.finished(first, 2.0, [11, 12])
    assert [c.request_id for c in children] == ["p/s0.0", "p/s1.0"]
    for child in children:
        assert child.arrival_time == 2.25  # the dispatch delay
        assert child.parent_program_id == "p" and child.program_id.startswith("p/")
        ids = run.context_of(child)
        assert ids[:10] == (*prompt, 11, 12) and len(ids) == 13 == child.prompt_len
    (s0,) = run.finished(children[0], 3.0, [20, 21])
    assert (s0.request_id, s0.arrival_time, s0.tool, s0.last_call) == ("p/s0.1", 3.5, None, True)
    assert run.context_of(s0)[:15] == (*run.context_of(children[0]), 20, 21)


def test_agent_run_join_context_holds_every_result() -> None:
    run = AgentRun(_fanout_workload(), TokenContexts(VOCAB))
    (first,) = run.first_requests()
    prompt = run.context_of(first)
    c0, c1 = run.finished(first, 2.0, [11, 12])
    (c0_last,) = run.finished(c0, 3.0, [20, 21])
    (c1_last,) = run.finished(c1, 3.1, [30, 31])
    assert run.finished(c0_last, 4.0, [40]) == []
    (join,) = run.finished(c1_last, 6.0, [50, 51])
    assert (join.request_id, join.arrival_time, join.last_call) == ("p.1", 6.0, True)
    ids = run.context_of(join)
    # parent prompt + its output + child 0's final output + child 1's + the join instruction
    assert ids[:13] == (*prompt, 11, 12, 40, 50, 51) and len(ids) == 13 + 4 == join.prompt_len
    assert run.finished(join, 7.0, [60, 61, 62]) == []
    (record,) = run.program_records()
    assert (record.program_id, record.arrival_time, record.finish_time) == ("p", 1.0, 7.0)
    assert (record.num_calls, record.num_subagents, record.completion_time) == (6, 2, 6.0)
    assert record.tool_time == pytest.approx(4.0)  # from 2.0 (fan-out) to 6.0 (join)


def test_agent_run_failure_stops_the_tree() -> None:
    run = AgentRun(_fanout_workload(), TokenContexts(VOCAB))
    (first,) = run.first_requests()
    c0, c1 = run.finished(first, 2.0, [11, 12])
    run.failed(c0, 2.5)
    assert run.finished(c1, 3.0, [1]) == []
    (record,) = run.program_records()
    assert record.failed and record.completion_time is None


def test_agent_run_chain_matches_next_request() -> None:
    """For programs without sub-agents AgentRun makes exactly what next_request makes (the
    ids the simulator's golden run was recorded with)."""
    workload = get_workload("agent-swe", seed=4, num_requests=3, length_scale=0.05)
    run = AgentRun(workload, TokenContexts(VOCAB))
    for first in run.first_requests():
        request = first
        while True:
            output = list(range(100, 100 + request.output_len))
            expected = workload.next_request(
                request,
                9.0,
                vocab_size=VOCAB,
                prompt_token_ids=run.context_of(request),
                output_token_ids=output,
            )
            made = run.finished(request, 9.0, output)
            if expected is None:
                assert made == []
                break
            assert made == [expected]
            assert run.context_of(made[0]) == expected.prompt_token_ids
            request = made[0]


def test_agent_run_needs_programs_and_rejects_fanout_for_next_request() -> None:
    with pytest.raises(HeddleError, match="no agent programs"):
        AgentRun(get_workload("chat", num_requests=2), TokenContexts(VOCAB))
    workload = _fanout_workload()
    with pytest.raises(HeddleError, match="AgentRun"):
        workload.next_request(workload.requests[0], 1.0)
    with pytest.raises(HeddleError, match="must not contain"):
        AgentProgram("a.b", 0.0, (AgentCall(4, 1, 0.0),))
