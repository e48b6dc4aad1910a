"""The agent load client: chat contexts, tool waits, deterministic program shapes (fake server)."""

from __future__ import annotations

import pytest

from heddle.bench import run_bench
from heddle.bench.agents import AgentLoadOptions, ChatContexts, chat_payload, tool_name
from heddle.bench.chat_stream import ChatTurn
from heddle.workloads import SUBAGENTS, USER_TURN, AgentCall, AgentProgram, Workload
from tests.server.fakes import make_engine
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def fake_server():
    engine = make_engine(
        num_blocks=2048, max_model_len=8192, step_time=0.002, max_num_batched_tokens=1024
    )
    live = LiveServer(engine).start()
    yield live
    live.stop()


def _program(latency: float = 0.3) -> AgentProgram:
    calls = (
        AgentCall(6, 3, latency, "bash:read", 0.1),
        AgentCall(4, 2, 0.0, USER_TURN, 0.0),
        AgentCall(5, 4, 0.0, "none"),
    )
    return AgentProgram("p0", 0.0, calls, seed="s", shared_prefix=(("sys", 2),))


def test_chat_contexts_append_assistant_tool_and_user_messages() -> None:
    program = _program()
    contexts = ChatContexts()
    first = contexts.first(program, program.first_request())
    assert [m["role"] for m in first] == ["system", "user"]
    assert len(first[0]["content"].split()) == 2 and len(first[1]["content"].split()) == 4
    # No tool call came back: the text is the call, answered by one tool message.
    second = contexts.after(program, 1, first, ChatTurn("ls -la", completion_tokens=3))
    assistant, tool = second[2], second[3]
    assert assistant["content"] == "ls -la"
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "bash_read" == tool_name("bash:read")
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": tool["content"]}
    assert len(tool["content"].split()) == 4 and second[:2] == first
    # The server's own tool calls are kept, each answered; the planned result is split.
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    again = contexts.after(program, 1, first, ChatTurn("", calls, 3))
    assert again[2]["tool_calls"] == calls
    assert [m["tool_call_id"] for m in again[3:]] == ["a", "b"]
    assert all(len(m["content"].split()) == 2 for m in again[3:])
    # A user turn: the answer as text, then the user's next message.
    third = contexts.after(program, 2, second, ChatTurn("done", completion_tokens=2))
    assert third[-2] == {"role": "assistant", "content": "done"}
    assert third[-1]["role"] == "user" and len(third[-1]["content"].split()) == 5
    # The same inputs give the same messages (programs are deterministic).
    assert contexts.after(program, 1, first, ChatTurn("ls -la", completion_tokens=3)) == second


def test_chat_contexts_fork_and_join() -> None:
    children = tuple(
        AgentProgram(f"r/s{j}", 0.0, (AgentCall(3, 2, 0.0, "none"),), seed=f"c{j}", parent_id="r")
        for j in range(2)
    )
    parent = AgentProgram(
        "r", 0.0, (AgentCall(5, 2, 0.0, SUBAGENTS, None, children), AgentCall(2, 2, 0.0, "x"))
    )
    contexts = ChatContexts()
    first = contexts.first(parent, parent.first_request())
    plan = ChatTurn("plan", completion_tokens=2)
    child = contexts.fork(children[0], first, plan)
    assert child[: len(first)] == first  # the shared prefix
    assert child[len(first)] == {"role": "assistant", "content": "plan"}
    assert child[-1]["role"] == "user" and len(child[-1]["content"].split()) == 3
    results = [(c, ChatTurn(f"found {j}", completion_tokens=2)) for j, c in enumerate(children)]
    joined = contexts.join(parent, 1, first, plan, results)
    assistant = joined[len(first)]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_r_s0", "call_r_s1"]
    assert [m["content"] for m in joined if m["role"] == "tool"] == ["found 0", "found 1"]
    assert joined[-1]["role"] == "user"


def test_payload_asks_for_the_planned_length_and_names_the_session() -> None:
    program = _program()
    request = program.first_request()
    options = AgentLoadOptions(url="u", model="m")
    payload = chat_payload(request, ({"role": "user", "content": "x"},), options)
    assert (payload["max_tokens"], payload["min_tokens"], payload["ignore_eos"]) == (3, 3, True)
    assert (payload["session_id"], payload["expected_pause"]) == ("p0", 0.1)
    assert "close_session" not in payload and payload["stream"] is True
    options.extensions = False
    bare = chat_payload(request, ({"role": "user", "content": "x"},), options)
    assert "session_id" not in bare and "expected_pause" not in bare


def test_programs_run_their_planned_shape_and_wait_for_tools(fake_server) -> None:
    program = _program(latency=0.3)
    workload = Workload("handmade", {}, 0, [program.first_request()], [program])
    result = run_bench(fake_server.base_url, workload, concurrency=1)
    assert result.errors == {}
    records = {r.request_id: r for r in result.records}
    assert sorted(records) == ["p0.0", "p0.1", "p0.2"]
    assert [records[f"p0.{k}"].num_output_tokens for k in range(3)] == [3, 2, 4]
    # The second call left only after the tool's 0.3 s.
    assert records["p0.1"].arrival_time >= records["p0.0"].finish_time + 0.3
    assert records["p0.2"].arrival_time >= records["p0.1"].finish_time
    programs = result.programs
    assert programs is not None and programs.num_completed == 1 and programs.num_calls == 3
    assert programs.completion_time.mean == pytest.approx(
        records["p0.2"].finish_time - records["p0.0"].arrival_time, abs=0.05
    )
    assert programs.cache_hit_rate is not None and programs.cache_hit_rate > 0
    assert result.to_dict()["programs"]["num_completed"] == 1
    fake_server.assert_pool_whole()


@pytest.mark.parametrize("name", ["agent-bfcl", "agent-fanout"])
def test_named_workloads_complete_with_planned_lengths(fake_server, name: str) -> None:
    result = run_bench(
        fake_server.base_url,
        name,
        request_rate=20.0,
        num_requests=3,
        workload_options={"length_scale": 0.01, "tool_time_factor": 0.01},
    )
    assert result.errors == {} and result.programs is not None
    assert result.programs.num_completed == 3
    planned = {r.request_id: r.output_len for r in result.workload_requests}
    assert {r.request_id: r.num_output_tokens for r in result.records} == planned
    fake_server.assert_pool_whole()


def test_max_duration_stops_programs_cleanly(fake_server) -> None:
    program = _program(latency=5.0)
    workload = Workload("handmade", {}, 0, [program.first_request()], [program])
    result = run_bench(fake_server.base_url, workload, concurrency=1, max_duration=1.0)
    assert [r.request_id for r in result.records] == ["p0.0"]
    assert result.num_not_sent == 1
    assert result.programs is not None and result.programs.num_failed == 1
    fake_server.assert_pool_whole()
