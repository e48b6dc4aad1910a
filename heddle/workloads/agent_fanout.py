"""`agent-fanout`: a planner that calls k sub-agents in parallel and joins their results.

The orchestrator-worker pattern of Anthropic's multi-agent research system ("How we built our
multi-agent research system", June 2025: a lead agent plans, spawns subagents that search in
parallel, each in its own context, then condenses their findings; simple queries use one agent,
comparisons 2-4, complex research more): the planner writes a plan, k ~ U{2..5} sub-agents each
start from the planner's whole context plus their own task (the shared prefix KVFlow and
vLLM's session RFC #52113 point at), run 2-4 search/read turns, and return a summary; the
planner's next call sees every summary. A second round of fan-out follows with probability
0.3, then the final answer. vLLM's AgentX traffic (RFC #57103) has sub-agents in 44% of
sessions. Lengths and tool times are assumptions of this workload: planner system prompt 1000
tokens (shared), query 100, plan 250, sub-task 80, sub-agent turn output 120, search results
600 (sigma 0.8), sub-agent summary 300, final answer 500; web tools lognormal median 1 s,
sigma 0.8.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from heddle.errors import HeddleError
from heddle.workloads.agent import (
    SUBAGENTS,
    AgentCall,
    AgentProgram,
    ToolTime,
    check_agent_options,
)
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.synthetic import clip_len, lognormal_len, streams

INF = math.inf

PLANNER_SYSTEM_LEN = 1000
WEB_TOOL = ToolTime("web", 1.0, 0.8)


def fanout_agent(
    seed: int = 0,
    num_requests: int = 20,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    min_subagents: int = 2,
    max_subagents: int = 5,
    second_round_share: float = 0.3,
    min_subagent_turns: int = 2,
    max_subagent_turns: int = 4,
    tool_time_factor: float = 1.0,
) -> list[AgentProgram]:
    """`num_requests` planner programs arriving at `rate` programs/s."""
    check_agent_options(num_requests, length_scale, tool_time_factor)
    if not 1 <= min_subagents <= max_subagents:
        raise HeddleError("need 1 <= min_subagents <= max_subagents")
    if not 1 <= min_subagent_turns <= max_subagent_turns:
        raise HeddleError("need 1 <= min_subagent_turns <= max_subagent_turns")
    if not 0.0 <= second_round_share <= 1.0:
        raise HeddleError("second_round_share must be in [0, 1]")
    rng_t, rng = streams(seed, "agent-fanout")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    system = clip_len(PLANNER_SYSTEM_LEN * length_scale, 1, 1 << 30)

    def n(mean: float, sigma: float = 0.5) -> int:
        return lognormal_len(rng, mean, sigma, length_scale, 4, 1 << 30)

    programs = []
    for i, t in enumerate(times):
        program_id = f"fanout-{i}"
        rounds = 2 if rng.random() < second_round_share else 1
        calls: list[AgentCall] = []
        extra = system + n(100)
        for r in range(rounds):
            k = rng.randint(min_subagents, max_subagents)
            children = tuple(
                _subagent(
                    rng,
                    f"{program_id}/r{r}s{j}",
                    f"{seed}:fanout:{i}:{r}:{j}",
                    n,
                    rng.randint(min_subagent_turns, max_subagent_turns),
                    tool_time_factor,
                )
                for j in range(k)
            )
            # The fan-out's expected pause: a sub-agent's planned tool time (they run at once).
            expected = max(sum(c.expected_pause or 0.0 for c in ch.calls) for ch in children)
            calls.append(AgentCall(extra, n(250), 0.0, SUBAGENTS, expected, children))
            extra = n(60)  # the join instruction after the results
        calls.append(AgentCall(extra, n(500), 0.0, "none"))
        programs.append(
            AgentProgram(
                program_id,
                t,
                tuple(calls),
                seed=f"{seed}:fanout:{i}",
                shared_prefix=((f"fanout-system:{system}", system),),
            )
        )
    return programs


def _subagent(
    rng: random.Random,
    program_id: str,
    seed: str,
    draw: Callable[..., int],
    turns: int,
    tool_time_factor: float,
) -> AgentProgram:
    calls = []
    extra = draw(80)  # its task
    for _ in range(turns - 1):
        latency = WEB_TOOL.draw(rng) * tool_time_factor
        calls.append(AgentCall(extra, draw(120), latency, WEB_TOOL.name, WEB_TOOL.mean))
        extra = draw(600, 0.8)
    calls.append(AgentCall(extra, draw(300), 0.0, "none"))
    return AgentProgram(
        program_id, 0.0, tuple(calls), seed=seed, parent_id=program_id.rsplit("/", 1)[0]
    )
