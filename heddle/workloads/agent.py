"""Agent workloads: programs of LLM calls separated by tool calls.

Call k's prompt is call k-1's prompt + its output + the tool's result, so consecutive calls share
a growing prefix (what a prefix cache and a program-aware scheduler can exploit). Only the first
call of a program has a fixed arrival time; each later call arrives when the previous one
finished plus the tool's latency, so the driver (the simulator's event loop or the load client)
asks the program for the next call with `next_request`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from heddle.errors import HeddleError
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.request import DEFAULT_LOW_ID, WorkloadRequest, synthetic_prompt_ids
from heddle.workloads.synthetic import lognormal_len, streams


@dataclass(frozen=True, slots=True)
class AgentCall:
    # Tokens added to the context before this call: the whole first prompt for call 0, the
    # previous tool's result for later calls.
    prompt_extra_len: int
    output_len: int
    tool_latency_after: float  # seconds the tool runs after this call; unused for the last call

    def __post_init__(self) -> None:
        if self.prompt_extra_len < 0 or self.output_len < 1 or self.tool_latency_after < 0:
            raise HeddleError(f"invalid agent call {self}")


@dataclass(frozen=True, slots=True)
class AgentProgram:
    program_id: str
    arrival_time: float
    calls: tuple[AgentCall, ...]
    seed: str = "0"  # seeds the synthetic ids of the first prompt, outputs and tool results
    request_class: str = "agent"
    user: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.calls, tuple):
            object.__setattr__(self, "calls", tuple(self.calls))
        if not self.calls or self.calls[0].prompt_extra_len < 1:
            raise HeddleError(f"program {self.program_id} needs a first call with a prompt")

    def request_id(self, call_index: int) -> str:
        return f"{self.program_id}.{call_index}"

    def planned_prompt_len(self, call_index: int) -> int:
        """Prompt length of a call if every earlier call generated its planned output."""
        before = self.calls[:call_index]
        return (
            sum(c.prompt_extra_len + c.output_len for c in before)
            + self.calls[call_index].prompt_extra_len
        )

    def first_request(self) -> WorkloadRequest:
        call = self.calls[0]
        return WorkloadRequest(
            self.request_id(0),
            self.arrival_time,
            call.prompt_extra_len,
            call.output_len,
            request_class=self.request_class,
            user=self.user,
            prompt_seed=f"{self.seed}:prompt",
            program_id=self.program_id,
            call_index=0,
        )

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
        """The call after `finished`, arriving at finish_time + the tool's latency; None when
        `finished` was the program's last call.

        With `vocab_size`, the new request carries explicit ids: the finished call's prompt
        (`prompt_token_ids`, or its synthetic ids) + its output (`output_token_ids` as the engine
        generated them, or synthetic ids) + synthetic tool-result ids. Pass the real ids where
        known so the prefix cache sees the context it would see in production. Without
        `vocab_size` only the lengths are extended. Priority, user and SLOs carry over.
        """
        if finished.program_id != self.program_id:
            raise HeddleError(
                f"request {finished.request_id} belongs to program {finished.program_id}, "
                f"not {self.program_id}"
            )
        k = finished.call_index + 1
        if k >= len(self.calls):
            return None
        prev, call = self.calls[k - 1], self.calls[k]
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
                else synthetic_prompt_ids(
                    output_len, vocab_size, f"{self.seed}:out:{k - 1}", low, high
                )
            )
            tool = synthetic_prompt_ids(
                call.prompt_extra_len, vocab_size, f"{self.seed}:tool:{k}", low, high
            )
            ids = prompt + output + tool
        prompt_len = finished.prompt_len + output_len + call.prompt_extra_len
        return WorkloadRequest(
            self.request_id(k),
            finish_time + prev.tool_latency_after,
            prompt_len,
            call.output_len,
            request_class=finished.request_class,
            user=finished.user,
            priority=finished.priority,
            ttft_slo=finished.ttft_slo,
            tpot_slo=finished.tpot_slo,
            prompt_token_ids=ids,
            prompt_seed=f"{self.seed}:context:{k}",
            program_id=self.program_id,
            call_index=k,
        )

    def flat_requests(self) -> list[WorkloadRequest]:
        """Every call with its planned lengths, as if each call took no time: arrival = program
        arrival + the tool latencies before it. For reports and token totals, not for driving."""
        out = []
        t = self.arrival_time
        for k, call in enumerate(self.calls):
            out.append(
                WorkloadRequest(
                    self.request_id(k),
                    t,
                    self.planned_prompt_len(k),
                    call.output_len,
                    request_class=self.request_class,
                    user=self.user,
                    prompt_seed=f"{self.seed}:context:{k}",
                    program_id=self.program_id,
                    call_index=k,
                )
            )
            t += call.tool_latency_after
        return out


def agent(
    seed: int = 0,
    num_requests: int = 20,
    rate: float = math.inf,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    min_calls: int = 2,
    max_calls: int = 6,
    prompt_mean: float = 600.0,
    output_mean: float = 120.0,
    tool_result_mean: float = 150.0,
    tool_latency_mean: float = 1.0,
    max_context_len: int = 8192,
) -> list[AgentProgram]:
    """`num_requests` programs (not calls) of min_calls..max_calls calls each. Lengths are
    lognormal around the given means (times length_scale); tool latencies lognormal around
    tool_latency_mean seconds. A program stops early rather than outgrow max_context_len."""
    if num_requests < 0 or length_scale <= 0:
        raise HeddleError("num_requests must be >= 0 and length_scale positive")
    if not 1 <= min_calls <= max_calls:
        raise HeddleError(f"need 1 <= min_calls <= max_calls, got {min_calls}, {max_calls}")
    if tool_latency_mean < 0:
        raise HeddleError("tool_latency_mean must be >= 0")
    rng_t, rng_len = streams(seed, "agent")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    programs = []
    for i, t in enumerate(times):
        num_calls = rng_len.randint(min_calls, max_calls)
        calls: list[AgentCall] = []
        context = 0
        for k in range(num_calls):
            mean = prompt_mean if k == 0 else tool_result_mean
            extra = lognormal_len(rng_len, mean, 0.6, length_scale, 1 if k else 4, 1 << 30)
            out = lognormal_len(rng_len, output_mean, 0.6, length_scale, 4, 1 << 30)
            latency = (
                rng_len.lognormvariate(math.log(tool_latency_mean) - 0.125, 0.5)
                if tool_latency_mean > 0
                else 0.0
            )
            if calls and context + extra + out > max_context_len:
                break
            context += extra + out
            calls.append(AgentCall(extra, out, latency))
        programs.append(AgentProgram(f"agent-{i}", t, tuple(calls), seed=f"{seed}:agent:{i}"))
    return programs
