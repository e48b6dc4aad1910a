"""`agent`: generic agent programs whose lengths and tool latencies a study sets itself.

A parametric chain generator (min_calls..max_calls calls, lognormal lengths around the given
means, lognormal tool latencies): benchmarks/scaling.py shapes its multi-turn router workload
with it. The sourced workloads are agent-swe, agent-bfcl and agent-fanout (docs/AGENTS.md).
"""

from __future__ import annotations

import math

from heddle.errors import HeddleError
from heddle.workloads.agent import AgentCall, AgentProgram
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.synthetic import lognormal_len, streams


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
