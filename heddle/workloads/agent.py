"""Agent programs: LLM calls separated by tool calls, user turns, or a fan-out to sub-agents.

Call k's prompt is call k-1's prompt + its output + what came back (a tool's result, the user's
next message, or the results of the sub-agents call k-1 fanned out to), so consecutive calls
share a growing prefix: what a prefix cache, parked KV and a program-aware scheduler exploit.
Only the first call of a root program has a fixed arrival time; each later call arrives when
the previous one finished plus the tool's latency (or when the last sub-agent finished), so the
driver (the simulator's event loop or the load client) asks an `AgentRun` for the next calls
(heddle/workloads/agent_run.py). The generators (agent_swe.py, agent_bfcl.py, agent_fanout.py)
say where their distributions come from.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from heddle.errors import HeddleError
from heddle.workloads.request import DEFAULT_LOW_ID, WorkloadRequest, synthetic_prompt_ids

# `AgentCall.tool` of a call whose program continues with the user's next message (a chat
# turn ends with a text answer), not with a tool.
USER_TURN = "user"
# `AgentCall.tool` of a call that fans out to sub-agents.
SUBAGENTS = "subagents"


@dataclass(frozen=True, slots=True)
class AgentCall:
    # Tokens added to the context before this call: the whole first prompt for call 0, the
    # previous tool's result (or the user's message, or the join instruction) for later calls.
    prompt_extra_len: int
    output_len: int
    tool_latency_after: float  # seconds the tool runs after this call; unused for the last call
    tool: str = "tool"  # what runs after this call: a tool's name, USER_TURN or SUBAGENTS
    # The pause a client would announce (the tool's typical time, not this draw); None: unknown.
    expected_pause: float | None = None
    # Sub-agents started when this call ends, in parallel, instead of a tool. Each child's first
    # prompt is this program's context so far + the child's task (the shared prefix); the next
    # call of this program arrives when the last child's last call finishes, with every child's
    # final output appended.
    subagents: tuple[AgentProgram, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_extra_len < 0 or self.output_len < 1 or self.tool_latency_after < 0:
            raise HeddleError(f"invalid agent call {self}")
        if not isinstance(self.subagents, tuple):
            object.__setattr__(self, "subagents", tuple(self.subagents))
        if self.expected_pause is not None and self.expected_pause < 0:
            raise HeddleError(f"invalid expected pause {self.expected_pause}")


@dataclass(frozen=True, slots=True)
class AgentProgram:
    program_id: str
    arrival_time: float
    calls: tuple[AgentCall, ...]
    seed: str = "0"  # seeds the synthetic ids of the first prompt, outputs and tool results
    request_class: str = "agent"
    user: str | None = None
    parent_id: str | None = None  # a sub-agent's parent program
    # The first prompt opens with these shared segments (seed, length), counted in
    # calls[0].prompt_extra_len: a system prompt or tool descriptions that other programs share.
    shared_prefix: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.calls, tuple):
            object.__setattr__(self, "calls", tuple(self.calls))
        if not isinstance(self.shared_prefix, tuple) or any(
            not isinstance(p, tuple) for p in self.shared_prefix
        ):
            object.__setattr__(
                self, "shared_prefix", tuple((str(s), int(n)) for s, n in self.shared_prefix)
            )
        if not self.calls or (self.parent_id is None and self.calls[0].prompt_extra_len < 1):
            raise HeddleError(f"program {self.program_id} needs a first call with a prompt")
        if sum(n for _, n in self.shared_prefix) > self.calls[0].prompt_extra_len:
            raise HeddleError(f"program {self.program_id}: the shared prefix outgrows its prompt")
        if "." in self.program_id:
            raise HeddleError(f"program id {self.program_id!r} must not contain '.'")
        if self.calls[-1].subagents:
            raise HeddleError(f"program {self.program_id}: the last call cannot fan out")

    @property
    def root_id(self) -> str:
        """The root program of a tree of sub-agents (ids are parent/child/...)."""
        return self.program_id.split("/", 1)[0]

    def request_id(self, call_index: int) -> str:
        return f"{self.program_id}.{call_index}"

    def call_request(
        self,
        call_index: int,
        arrival_time: float,
        prompt_len: int,
        *,
        prompt_token_ids: tuple[int, ...] | None = None,
        like: WorkloadRequest | None = None,
    ) -> WorkloadRequest:
        """The request of call `call_index`; priority, SLOs and user carry over from `like`
        (the program's previous call)."""
        call = self.calls[call_index]
        last = call_index == len(self.calls) - 1
        request = WorkloadRequest(
            self.request_id(call_index),
            arrival_time,
            prompt_len,
            call.output_len,
            request_class=self.request_class,
            user=self.user,
            prompt_token_ids=prompt_token_ids,
            prompt_seed=f"{self.seed}:prompt"
            if call_index == 0
            else f"{self.seed}:context:{call_index}",
            program_id=self.program_id,
            call_index=call_index,
            parent_program_id=self.parent_id,
            tool=None if last else call.tool,
            expected_pause=None if last else call.expected_pause,
            last_call=last,
            shared_prefix=self.shared_prefix if call_index == 0 else (),
        )
        if like is not None:
            request = replace(
                request,
                request_class=like.request_class,
                user=like.user,
                priority=like.priority,
                ttft_slo=like.ttft_slo,
                tpot_slo=like.tpot_slo,
            )
        return request

    def planned_prompt_len(self, call_index: int) -> int:
        """Prompt length of a call if every earlier call (and sub-agent) generated its planned
        output."""
        total = 0
        for k, call in enumerate(self.calls[: call_index + 1]):
            total += call.prompt_extra_len
            if k < call_index:
                total += call.output_len + sum(c.calls[-1].output_len for c in call.subagents)
        return total

    def first_request(self) -> WorkloadRequest:
        return self.call_request(0, self.arrival_time, self.calls[0].prompt_extra_len)

    def next_request(
        self,
        finished: WorkloadRequest,
        finish_time: float,
        *,
        vocab_size: int | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        output_token_ids: Sequence[int] | None = None,
        low: int = DEFAULT_LOW_ID,
        high: int | None = None,
    ) -> WorkloadRequest | None:
        """The call after `finished` in a program without sub-agents, arriving at
        finish_time + the tool's latency; None when `finished` was the program's last call.

        With `vocab_size`, the new request carries explicit ids: the finished call's prompt
        (`prompt_token_ids`, or its synthetic ids) + its output (`output_token_ids` as the engine
        generated them, or synthetic ids) + synthetic tool-result ids. Pass the real ids where
        known so the prefix cache sees the context it would see in production. Without
        `vocab_size` only the lengths are extended. Priority, user and SLOs carry over. Programs
        with sub-agents need an AgentRun, which keeps the state a join needs.
        """
        if finished.program_id != self.program_id:
            raise HeddleError(
                f"request {finished.request_id} belongs to program {finished.program_id}, "
                f"not {self.program_id}"
            )
        k = finished.call_index + 1
        if k >= len(self.calls):
            return None
        prev = self.calls[k - 1]
        if prev.subagents:
            raise HeddleError(f"program {self.program_id} fans out: drive it with an AgentRun")
        output_len = finished.output_len if output_token_ids is None else len(output_token_ids)
        ids: tuple[int, ...] | None = None
        if vocab_size is not None:
            prompt = (
                tuple(prompt_token_ids)
                if prompt_token_ids is not None
                else finished.prompt_ids(vocab_size, low, high)
            )
            output = (
                tuple(output_token_ids)
                if output_token_ids is not None
                else self.synthetic_output(k - 1, output_len, vocab_size, low, high)
            )
            ids = prompt + output + self.extra_ids(k, vocab_size, low, high)
        prompt_len = finished.prompt_len + output_len + self.calls[k].prompt_extra_len
        arrival = finish_time + prev.tool_latency_after
        return self.call_request(k, arrival, prompt_len, prompt_token_ids=ids, like=finished)

    def synthetic_output(
        self, call_index: int, length: int, vocab_size: int, low: int, high: int | None
    ) -> tuple[int, ...]:
        """Stand-in ids of a call's output when the driver has no real ones."""
        return synthetic_prompt_ids(length, vocab_size, f"{self.seed}:out:{call_index}", low, high)

    def extra_ids(
        self, call_index: int, vocab_size: int, low: int = DEFAULT_LOW_ID, high: int | None = None
    ) -> tuple[int, ...]:
        """Ids of what call `call_index` adds to the context (tool result, user message, join
        instruction, or a sub-agent's task for its first call)."""
        seed = f"{self.seed}:tool:{call_index}" if call_index else f"{self.seed}:prompt"
        return synthetic_prompt_ids(
            self.calls[call_index].prompt_extra_len, vocab_size, seed, low, high
        )

    def flat_requests(self) -> list[WorkloadRequest]:
        """Every call of the program and its sub-agents with their planned lengths, as if each
        call took no time: arrival = program arrival + the tool latencies before it. For
        reports and token totals, not for driving."""
        out = []
        t = self.arrival_time
        for k, call in enumerate(self.calls):
            out.append(self.call_request(k, t, self.planned_prompt_len(k)))
            for child in call.subagents:
                base = self.planned_prompt_len(k) + call.output_len
                for request in replace(child, arrival_time=t).flat_requests():
                    out.append(replace(request, prompt_len=request.prompt_len + base))
            t += call.tool_latency_after
        return out

    def num_calls(self) -> int:
        """LLM calls of the program, its sub-agents' included."""
        return sum(1 + sum(c.num_calls() for c in call.subagents) for call in self.calls)


# -- drawing the parts of a program --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolTime:
    """A tool's latency: lognormal with the given median (seconds) and log-space sigma."""

    name: str
    median: float
    sigma: float

    @property
    def mean(self) -> float:
        """What a client announces as the expected pause (the distribution's mean)."""
        return self.median * math.exp(self.sigma * self.sigma / 2)

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median), self.sigma)


def check_agent_options(num_requests: int, length_scale: float, tool_time_factor: float) -> None:
    if num_requests < 0:
        raise HeddleError(f"num_requests must be >= 0, got {num_requests}")
    if length_scale <= 0:
        raise HeddleError(f"length_scale must be positive, got {length_scale}")
    if not (math.isfinite(tool_time_factor) and tool_time_factor > 0):
        raise HeddleError(f"tool_time_factor must be positive, got {tool_time_factor}")


def draw_from(rng: random.Random, histogram: Sequence[tuple[int, int]]) -> int:
    """A value drawn with the weights of an empirical histogram [(value, count), ...]."""
    values = [v for v, _ in histogram]
    weights = [c for _, c in histogram]
    return rng.choices(values, weights)[0]
