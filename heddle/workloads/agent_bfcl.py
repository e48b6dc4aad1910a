"""`agent-bfcl`: a BFCL-like multi-turn function-calling mix.

Each program is one BFCL multi-turn conversation: the function docs of the API classes it
involves (shared with every program that involves the same classes), then user turns; each user
turn takes one LLM call per function call (a multi-step chain: call, result, next call) and one
more for the text answer. The histograms below were counted from BFCL's multi-turn base set
(gorilla repo, berkeley-function-call-leaderboard/bfcl_eval/data/BFCL_v4_multi_turn_base.json
and possible_answer/; 200 conversations): 3.67 user turns and 5.71 ground-truth function calls
per conversation (the "about 6 turns" of Continuum's BFCL traces), so 9.4 LLM calls per
program here; user messages average 182 characters (~45 tokens); an involved class's function
docs are 6-17.5k characters (~1.5-4.4k tokens), 1.675 classes per conversation; a ground-truth
call averages 56 characters (~30 tokens with its JSON wrapper).

Tool times are not in BFCL (its executors are in-process Python); the short tools here stand
for web APIs: lognormal, median 0.3 s, sigma 0.7 (mean 0.38 s, p99 ~1.5 s). BFCL's harness
sends the next user turn at once; `user_think_time` adds a pause there.
"""

from __future__ import annotations

import math

from heddle.workloads.agent import (
    USER_TURN,
    AgentCall,
    AgentProgram,
    ToolTime,
    check_agent_options,
    draw_from,
)
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.synthetic import clip_len, lognormal_len, streams

INF = math.inf

# (user turns, conversations) and (function calls in a user turn, user turns) in BFCL's
# multi-turn base set.
BFCL_TURNS = ((1, 3), (2, 40), (3, 50), (4, 50), (5, 43), (6, 12), (7, 2))
BFCL_CALLS_PER_TURN = ((0, 3), (1, 474), (2, 156), (3, 67), (4, 20), (5, 11), (6, 1), (7, 2))
# Function docs per API class, in tokens (characters of multi_turn_func_doc/*.json / 4), and
# how many of the 200 conversations involve each class.
BFCL_CLASSES = (
    ("GorillaFileSystem", 3488, 50),
    ("VehicleControlAPI", 4386, 50),
    ("TradingBot", 3152, 50),
    ("TravelAPI", 4245, 50),
    ("MessageAPI", 1507, 40),
    ("TwitterAPI", 2643, 39),
    ("TicketAPI", 1662, 31),
    ("MathAPI", 2290, 25),
)
TWO_CLASS_SHARE = 0.675  # 1.675 classes per conversation
BFCL_SYSTEM_LEN = 120  # the instruction before the function docs, shared by all
BFCL_TOOL = ToolTime("api", 0.3, 0.7)


def bfcl_agent(
    seed: int = 0,
    num_requests: int = 50,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    user_message_mean: float = 45.0,
    call_output_mean: float = 30.0,
    answer_output_mean: float = 60.0,
    result_mean: float = 40.0,
    user_think_time: float = 0.0,
    tool_time_factor: float = 1.0,
) -> list[AgentProgram]:
    """`num_requests` function-calling conversations arriving at `rate` programs/s."""
    check_agent_options(num_requests, length_scale, tool_time_factor)
    rng_t, rng = streams(seed, "agent-bfcl")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    system = clip_len(BFCL_SYSTEM_LEN * length_scale, 1, 1 << 30)
    names = [name for name, _, _ in BFCL_CLASSES]
    weights = [count for _, _, count in BFCL_CLASSES]
    docs = {name: clip_len(n * length_scale, 1, 1 << 30) for name, n, _ in BFCL_CLASSES}
    programs = []
    for i, t in enumerate(times):
        chosen = {rng.choices(names, weights)[0]}
        if rng.random() < TWO_CLASS_SHARE:
            chosen.add(rng.choice([n for n in names if n not in chosen]))
        classes = sorted(chosen)
        prefix = (
            (f"bfcl-system:{system}", system),
            *((f"bfcl-doc:{name}:{docs[name]}", docs[name]) for name in classes),
        )
        calls: list[AgentCall] = []
        extra = sum(n for _, n in prefix)
        for _ in range(draw_from(rng, BFCL_TURNS)):
            extra += lognormal_len(rng, user_message_mean, 0.5, length_scale, 4, 1 << 30)
            for _ in range(draw_from(rng, BFCL_CALLS_PER_TURN)):
                output = lognormal_len(rng, call_output_mean, 0.4, length_scale, 8, 1 << 30)
                latency = BFCL_TOOL.draw(rng) * tool_time_factor
                calls.append(AgentCall(extra, output, latency, BFCL_TOOL.name, BFCL_TOOL.mean))
                extra = lognormal_len(rng, result_mean, 0.8, length_scale, 4, 1 << 30)
            answer = lognormal_len(rng, answer_output_mean, 0.6, length_scale, 4, 1 << 30)
            calls.append(AgentCall(extra, answer, user_think_time, USER_TURN, user_think_time))
            extra = 0
        programs.append(
            AgentProgram(
                f"bfcl-{i}",
                t,
                tuple(calls),
                seed=f"{seed}:bfcl:{i}",
                request_class="agent",
                shared_prefix=prefix,
            )
        )
    return programs
