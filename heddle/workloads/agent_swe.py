"""`agent-swe`: a SWE-bench-like coding agent (a mini-swe-agent-style bash loop).

Each program resolves one issue: a shared system prompt, the issue text, then turns of
"thought + one bash command" whose output (a file, a grep, a test log) is appended to the
context. Sources of the distributions (docs/AGENTS.md has the full list):

- turns per program: mean ~11 with a long right tail. Continuum (arXiv 2511.02230) replays
  SWE-bench agent traces with Llama-3.1-8B/70B (their Fig. 3 shows about 11 turns); frontier
  models run far longer programs (median 53-78 steps on SWE-Bench Pro, nilenso's trajectory
  analysis), hence a lognormal with sigma 0.6 clipped to [3, 60].
- issue text: SWE-bench's problem statements have a mean of 195 words and a maximum of ~4,500
  (Jimenez et al., ICLR 2024, Table 1): lognormal, mean 260 tokens, sigma 0.9.
- contexts: successful mini-SWE-agent trajectories mostly stay under 20k tokens ("The Limits of
  Long-Context Reasoning in Automated Bug Fixing", arXiv 2602.16069); with observations of mean
  ~900 tokens (sigma 1.0, cut at 10k, as agents truncate long outputs) the mean final context
  is ~13k tokens and the tail reaches tens of thousands.
- tool times: Continuum reports tool calls from milliseconds to tens of seconds and pins KV only
  for tools whose moving-average time is under 2 s; here reads and edits (cat, grep, sed) take
  tens of milliseconds, running a script seconds, a test suite ~10 s with a heavy tail
  (lognormal sigma 1.0-1.2: p99 of tens of seconds to minutes). Early turns explore, later ones
  edit and test.
"""

from __future__ import annotations

import math

from heddle.errors import HeddleError
from heddle.workloads.agent import AgentCall, AgentProgram, ToolTime, check_agent_options
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.synthetic import clip_len, lognormal_len, streams

INF = math.inf

SWE_SYSTEM_PROMPT_LEN = 1200  # mini-swe-agent's system + instance template, shared
SWE_TOOLS = (
    ToolTime("bash:read", 0.03, 0.8),  # cat / grep / find / ls / sed -n
    ToolTime("bash:edit", 0.05, 0.6),  # sed -i / cat <<EOF > file
    ToolTime("bash:run", 1.5, 1.0),  # python reproduce.py
    ToolTime("bash:test", 6.0, 1.2),  # pytest
)
# Tool shares (read, edit, run, test) in the first 40% of a program's turns and after.
EXPLORE_WEIGHTS = (0.75, 0.05, 0.15, 0.05)
FIX_WEIGHTS = (0.35, 0.30, 0.15, 0.20)


def swe_agent(
    seed: int = 0,
    num_requests: int = 20,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    turns_mean: float = 10.9,
    turns_sigma: float = 0.6,
    min_turns: int = 3,
    max_turns: int = 60,
    issue_mean: float = 260.0,
    output_mean: float = 150.0,
    observation_mean: float = 900.0,
    max_observation_len: int = 10000,
    system_prompt_len: int = SWE_SYSTEM_PROMPT_LEN,
    tool_time_factor: float = 1.0,
    max_context_len: int = 65536,
    tool_sigma_scale: float = 1.0,
) -> list[AgentProgram]:
    """`num_requests` coding-agent programs arriving at `rate` programs/s.

    Lengths scale with `length_scale`. `tool_time_factor` multiplies every tool's actual time
    but not the expected pause the program announces (a tool slower than expected). A program
    stops early rather than outgrow `max_context_len`. `tool_sigma_scale` multiplies every tool's
    log-space sigma at the same median: a heavier tail (a stress knob, not a measured
    distribution; the announced pause is the new distribution's mean). The random draws are the
    same for every scale, so two scales give the same programs with only their tool times
    stretched away from the median.
    """
    check_agent_options(num_requests, length_scale, tool_time_factor)
    if not (math.isfinite(tool_sigma_scale) and tool_sigma_scale > 0):
        raise HeddleError(f"tool_sigma_scale must be positive, got {tool_sigma_scale}")
    tools = tuple(ToolTime(t.name, t.median, t.sigma * tool_sigma_scale) for t in SWE_TOOLS)
    rng_t, rng = streams(seed, "agent-swe")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    system = clip_len(system_prompt_len * length_scale, 1, 1 << 30)
    programs = []
    for i, t in enumerate(times):
        turns = clip_len(
            rng.lognormvariate(math.log(turns_mean) - turns_sigma**2 / 2, turns_sigma),
            min_turns,
            max_turns,
        )
        issue = lognormal_len(rng, issue_mean, 0.9, length_scale, 8, 1 << 30)
        calls: list[AgentCall] = []
        context = system + issue
        extra = system + issue
        for k in range(turns):
            output = lognormal_len(rng, output_mean, 0.6, length_scale, 8, 1 << 30)
            weights = EXPLORE_WEIGHTS if k < 0.4 * turns else FIX_WEIGHTS
            tool = rng.choices(tools, weights)[0]
            observation = lognormal_len(
                rng, observation_mean, 1.0, length_scale, 4, max_observation_len
            )
            if calls and context + output > max_context_len:
                break
            context += output
            latency = tool.draw(rng) * tool_time_factor
            calls.append(AgentCall(extra, output, latency, tool.name, tool.mean))
            extra = observation
            context += observation
        programs.append(
            AgentProgram(
                f"swe-{i}",
                t,
                tuple(calls),
                seed=f"{seed}:swe:{i}",
                shared_prefix=((f"swe-system:{system}", system),),
            )
        )
    return programs
