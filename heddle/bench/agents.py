"""The agent load client: multi-turn programs against any OpenAI-compatible chat server.

Each program of an agent workload (agent-swe, agent-bfcl, agent-fanout) runs as a conversation
on /v1/chat/completions: the system prompt and the task, then for every call the assistant's
answer, the tool's result as a `tool` message (or the user's next message), and after a
fan-out one `tool` message per sub-agent with its final answer. Between calls the client waits
the tool's time. An AgentRun (heddle/workloads/agent_run.py) decides what comes next, so the
simulator and this client run the same programs.

The same program runs the same on every server. A small model will not reliably call tools, so
the program does not wait for it to: each call asks for exactly the planned number of tokens
(`max_tokens`, plus `ignore_eos` and `min_tokens`, which heddle, vLLM and llama-server honour),
the tool results are synthetic text of planned length from the workload's seeds, and the plan,
not the model, decides the number of calls and when the program ends. When the server returns
`tool_calls` they are kept in the assistant message and each gets a `tool` answer (the planned
result split between them); when it returns only text, that text is the call: the assistant
message carries it as content plus one tool call naming the planned tool, which the `tool`
message answers. Requests carry heddle's session fields (`session_id`, `parent_session_id`,
`expected_pause`, `close_session`) unless extensions are off; other servers ignore them.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from heddle.bench.chat_stream import ChatOutcome, ChatTurn, send_chat
from heddle.bench.prompts import text_prompt
from heddle.bench.runner import load_client, scheduling_extras
from heddle.metrics.programs import ProgramRecord
from heddle.workloads import USER_TURN, AgentProgram, AgentRun, Workload, WorkloadRequest

Messages = tuple[dict[str, Any], ...]


def tool_name(name: str) -> str:
    """An OpenAI function name (letters, digits, _ and -) for a workload's tool name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"


class ChatContexts:
    """Contexts as chat messages; outputs are ChatTurns. Token counts are the server's."""

    def first(self, program: AgentProgram, request: WorkloadRequest) -> Messages:
        system = " ".join(text_prompt(n, seed) for seed, n in program.shared_prefix)
        task_len = request.prompt_len - sum(n for _, n in program.shared_prefix)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": text_prompt(max(1, task_len), program.seed)})
        return tuple(messages)

    def _assistant(
        self, program: AgentProgram, call_index: int, turn: ChatTurn, tool: str | None
    ) -> tuple[dict[str, Any], list[str]]:
        """The assistant message of `program`'s call `call_index` and the ids of its calls."""
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if tool is None:
            return message, []
        calls = [dict(c) for c in turn.tool_calls if c.get("id")]
        if not calls:  # the text is the call
            calls = [
                {
                    "id": f"call_{tool_name(program.program_id)}_{call_index}",
                    "type": "function",
                    "function": {"name": tool_name(tool), "arguments": "{}"},
                }
            ]
        message["tool_calls"] = calls
        return message, [c["id"] for c in calls]

    def _text(self, program: AgentProgram, call_index: int) -> str:
        length = program.calls[call_index].prompt_extra_len
        return text_prompt(length, f"{program.seed}:tool:{call_index}") if length else ""

    def after(
        self, program: AgentProgram, call_index: int, context: Messages, output: ChatTurn
    ) -> Messages:
        previous = program.calls[call_index - 1]
        if previous.tool == USER_TURN:
            assistant, _ = self._assistant(program, call_index - 1, output, None)
            user = {"role": "user", "content": self._text(program, call_index) or "continue"}
            return (*context, assistant, user)
        assistant, ids = self._assistant(program, call_index - 1, output, previous.tool)
        length = program.calls[call_index].prompt_extra_len
        results = [
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": text_prompt(
                    max(1, length // len(ids)), f"{program.seed}:tool:{call_index}:{i}"
                ),
            }
            for i, call_id in enumerate(ids)
        ]
        return (*context, assistant, *results)

    def fork(self, child: AgentProgram, context: Messages, output: ChatTurn) -> Messages:
        # The child sees the parent's answer as text (its delegation calls are the parent's).
        assistant = {"role": "assistant", "content": output.content}
        task = text_prompt(max(1, child.calls[0].prompt_extra_len), f"{child.seed}:prompt")
        return (*context, assistant, {"role": "user", "content": task})

    def join(
        self,
        program: AgentProgram,
        call_index: int,
        context: Messages,
        output: ChatTurn,
        results: Sequence[tuple[AgentProgram, ChatTurn]],
    ) -> Messages:
        calls = [
            {
                "id": f"call_{tool_name(child.program_id)}",
                "type": "function",
                "function": {"name": "subagent", "arguments": "{}"},
            }
            for child, _ in results
        ]
        assistant = {"role": "assistant", "content": output.content, "tool_calls": calls}
        answers = [
            {"role": "tool", "tool_call_id": call["id"], "content": turn.content or "done"}
            for call, (_, turn) in zip(calls, results, strict=True)
        ]
        instruction = self._text(program, call_index)
        tail = [{"role": "user", "content": instruction}] if instruction else []
        return (*context, assistant, *answers, *tail)

    def size(self, context: Messages) -> None:
        return None

    def output_len(self, output: ChatTurn) -> int | None:
        return output.completion_tokens


@dataclass(slots=True)
class AgentLoadOptions:
    url: str  # the full URL of the chat completions endpoint
    model: str
    concurrency: int | None = None  # programs in flight
    max_duration: float | None = None
    request_timeout: float | None = 300.0
    temperature: float = 0.0
    seed: int = 0
    extensions: bool = True  # heddle's fields: session ids, pause hints, scheduling hints
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class AgentLoadResult:
    outcomes: list[ChatOutcome]
    programs: list[ProgramRecord]
    num_not_sent: int  # calls not sent: past max_duration
    wall_time: float
    cache_reported: bool  # whether the server reported cached prompt tokens


def chat_payload(
    request: WorkloadRequest, messages: Messages, options: AgentLoadOptions
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": options.model,
        "messages": list(messages),
        "max_tokens": request.output_len,
        "min_tokens": request.output_len,
        "ignore_eos": True,
        "temperature": options.temperature,
        "seed": options.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.extensions and request.program_id is not None:
        payload.update(
            scheduling_extras(
                request,
                session_id=request.program_id,
                parent_session_id=request.parent_program_id,
                expected_pause=request.expected_pause,
                close_session=True if request.last_call else None,
            )
        )
    return payload


async def run_programs(
    workload: Workload,
    options: AgentLoadOptions,
    on_done: Callable[[ChatOutcome], None] | None = None,
) -> AgentLoadResult:
    """Run every program of `workload` against the server; bounded by max_duration."""
    async with load_client(options.headers) as client:
        return await _ProgramDriver(client, workload, options, on_done).run()


class _ProgramDriver:
    def __init__(
        self,
        client: httpx.AsyncClient,
        workload: Workload,
        options: AgentLoadOptions,
        on_done: Callable[[ChatOutcome], None] | None,
    ) -> None:
        self.client = client
        self.options = options
        self.on_done = on_done
        self.run_state: AgentRun[Messages, ChatTurn] = AgentRun(workload, ChatContexts())
        self.outcomes: list[ChatOutcome] = []
        self.num_not_sent = 0
        self.cache_reported = False
        self.seats = asyncio.Semaphore(options.concurrency) if options.concurrency else None
        self.t0 = 0.0
        self.deadline: float | None = None

    async def run(self) -> AgentLoadResult:
        self.t0 = time.perf_counter()
        if self.options.max_duration is not None:
            self.deadline = self.t0 + self.options.max_duration
        programs = [self._program(r) for r in self.run_state.first_requests()]
        await asyncio.gather(*programs)
        return AgentLoadResult(
            self.outcomes,
            self.run_state.program_records(),
            self.num_not_sent,
            time.perf_counter() - self.t0,
            self.cache_reported,
        )

    async def _program(self, first: WorkloadRequest) -> None:
        """One root program, from its first call's arrival to its end; a seat (closed loop)
        is held for the whole program, sub-agents included."""
        if not await self._sleep_until(first.arrival_time):
            self.num_not_sent += 1
            return
        if self.seats is None:
            await self._thread(first)
            return
        async with self.seats:
            await self._thread(first)

    async def _thread(self, request: WorkloadRequest) -> None:
        """Run calls one after another; a fan-out runs its sub-agents' threads in parallel and
        the join's call continues on the thread of the child that finished last."""
        next_requests = [request]
        while next_requests:
            if len(next_requests) > 1:
                await asyncio.gather(*(self._thread(r) for r in next_requests))
                return
            request = next_requests[0]
            if not await self._sleep_until(request.arrival_time):
                self.num_not_sent += 1
                self.run_state.failed(request, time.perf_counter() - self.t0)
                return
            next_requests = await self._call(request)

    async def _call(self, request: WorkloadRequest) -> list[WorkloadRequest]:
        messages = self.run_state.context_of(request)
        outcome = await send_chat(
            self.client,
            self.options.url,
            chat_payload(request, messages, self.options),
            request,
            self.t0,
            self.options.request_timeout,
            self.deadline,
        )
        self.outcomes.append(outcome)
        if self.on_done is not None:
            self.on_done(outcome)
        finish = outcome.record.finish_time or 0.0
        if outcome.error is not None:
            self.run_state.failed(request, finish)
            return []
        self.cache_reported |= outcome.turn.cached_tokens is not None
        return self.run_state.finished(request, finish, outcome.turn)

    async def _sleep_until(self, offset: float) -> bool:
        """Wait until t0 + offset; False when that is past the run's deadline."""
        when = self.t0 + offset
        if self.deadline is not None and when >= self.deadline:
            return False
        delay = when - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return True
