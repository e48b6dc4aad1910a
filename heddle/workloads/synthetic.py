"""Synthetic workloads: fixed lengths, chat-like lengths, and mixes that stress a scheduler.

Every generator takes (seed, num_requests, rate, arrival, cv, length_scale, ...) and returns
requests sorted by arrival. Arrivals and lengths come from separate random streams, so a
sweep over `rate` replays the same requests at different loads.
"""

from __future__ import annotations

import math
import random

from heddle.errors import HeddleError
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.request import WorkloadRequest

INF = math.inf

# ShareGPT-like means (tokens); the sigmas keep the clipped means within ~1% of these.
CHAT_PROMPT_MEAN, CHAT_PROMPT_SIGMA = 160.0, 1.0
CHAT_OUTPUT_MEAN, CHAT_OUTPUT_SIGMA = 340.0, 0.8


def lognormal_len(
    rng: random.Random, mean: float, sigma: float, scale: float, low: int, high: int
) -> int:
    """A lognormal length of the given mean (before clipping), times `scale`, in [low, high]."""
    mu = math.log(mean) - sigma * sigma / 2
    return clip_len(rng.lognormvariate(mu, sigma) * scale, low, high)


def clip_len(value: float, low: int, high: int) -> int:
    return max(max(1, low), min(high, round(value)))


def streams(seed: int, name: str) -> tuple[random.Random, random.Random]:
    """Independent (arrivals, lengths) random streams of one workload."""
    return random.Random(f"{seed}:{name}:arrivals"), random.Random(f"{seed}:{name}:lengths")


def pick_share(rng: random.Random, n: int, share: float, what: str) -> set[int]:
    """Exactly round(share * n) of the indices 0..n-1, chosen at random."""
    if not 0.0 <= share <= 1.0:
        raise HeddleError(f"{what} must be in [0, 1], got {share}")
    return set(rng.sample(range(n), round(share * n)))


def _check_common(num_requests: int, length_scale: float) -> None:
    if num_requests < 0:
        raise HeddleError(f"num_requests must be >= 0, got {num_requests}")
    if length_scale <= 0:
        raise HeddleError(f"length_scale must be positive, got {length_scale}")


def random_workload(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    input_len: int = 512,
    output_len: int = 128,
    range_ratio: float = 0.0,
) -> list[WorkloadRequest]:
    """Fixed lengths, or uniform in [len*(1-range_ratio), len*(1+range_ratio)] as in vLLM."""
    _check_common(num_requests, length_scale)
    if not 0.0 <= range_ratio < 1.0:
        raise HeddleError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng_t, rng_len = streams(seed, "random")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)

    def draw(mean: int) -> int:
        lo, hi = round(mean * (1 - range_ratio)), round(mean * (1 + range_ratio))
        return clip_len(rng_len.randint(max(1, lo), max(1, hi)) * length_scale, 1, 1 << 30)

    return [
        WorkloadRequest(
            f"random-{i}", t, draw(input_len), draw(output_len), prompt_seed=f"{seed}:random:{i}"
        )
        for i, t in enumerate(times)
    ]


def chat(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    prompt_mean: float = CHAT_PROMPT_MEAN,
    output_mean: float = CHAT_OUTPUT_MEAN,
    min_len: int = 4,
    max_prompt_len: int = 2048,
    max_output_len: int = 2048,
) -> list[WorkloadRequest]:
    """ShareGPT-like chat: lognormal prompt and output lengths (means ~160 and ~340 tokens)."""
    _check_common(num_requests, length_scale)
    rng_t, rng_len = streams(seed, "chat")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    out = []
    for i, t in enumerate(times):
        p = lognormal_len(
            rng_len, prompt_mean, CHAT_PROMPT_SIGMA, length_scale, min_len, max_prompt_len
        )
        o = lognormal_len(
            rng_len, output_mean, CHAT_OUTPUT_SIGMA, length_scale, min_len, max_output_len
        )
        out.append(WorkloadRequest(f"chat-{i}", t, p, o, prompt_seed=f"{seed}:chat:{i}"))
    return out


def long_prompt_mix(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    long_share: float = 0.1,
    long_prompt_min: int = 2000,
    long_prompt_max: int = 4000,
    long_output_min: int = 16,
    long_output_max: int = 128,
    max_prompt_len: int = 2048,
    max_output_len: int = 2048,
) -> list[WorkloadRequest]:
    """Short chats (class "short") plus a share of multi-thousand-token prompts with short
    outputs (class "long"): the head-of-line blocking case that chunked prefill addresses."""
    _check_common(num_requests, length_scale)
    if not 0 < long_prompt_min <= long_prompt_max or not 0 < long_output_min <= long_output_max:
        raise HeddleError("long_*_min must be positive and <= long_*_max")
    rng_t, rng_len = streams(seed, "long-prompt-mix")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    longs = pick_share(rng_len, num_requests, long_share, "long_share")
    out = []
    for i, t in enumerate(times):
        if i in longs:
            cls = "long"
            p = clip_len(
                rng_len.randint(long_prompt_min, long_prompt_max) * length_scale, 1, 1 << 30
            )
            o = clip_len(
                rng_len.randint(long_output_min, long_output_max) * length_scale, 1, 1 << 30
            )
        else:
            cls = "short"
            p = lognormal_len(
                rng_len, CHAT_PROMPT_MEAN, CHAT_PROMPT_SIGMA, length_scale, 4, max_prompt_len
            )
            o = lognormal_len(
                rng_len, CHAT_OUTPUT_MEAN, CHAT_OUTPUT_SIGMA, length_scale, 4, max_output_len
            )
        out.append(
            WorkloadRequest(
                f"lpm-{i}", t, p, o, request_class=cls, prompt_seed=f"{seed}:long-prompt-mix:{i}"
            )
        )
    return out


def reasoning_mix(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    reasoning_share: float = 0.15,
    prompt_mean: float = 120.0,
    output_mean: float = 80.0,
    reasoning_min_factor: float = 10.0,
    reasoning_max_factor: float = 50.0,
    max_prompt_len: int = 2048,
    max_output_len: int = 8192,
) -> list[WorkloadRequest]:
    """Short prompts; most outputs short (class "short"), a share 10-50x longer ("reasoning"):
    the case where shallow requests idle behind deep chains of thought."""
    _check_common(num_requests, length_scale)
    if not 1.0 <= reasoning_min_factor <= reasoning_max_factor:
        raise HeddleError("need 1 <= reasoning_min_factor <= reasoning_max_factor")
    rng_t, rng_len = streams(seed, "reasoning-mix")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    deep = pick_share(rng_len, num_requests, reasoning_share, "reasoning_share")
    out = []
    for i, t in enumerate(times):
        p = lognormal_len(rng_len, prompt_mean, 0.8, length_scale, 4, max_prompt_len)
        o = lognormal_len(rng_len, output_mean, 0.6, length_scale, 4, max_output_len)
        cls = "short"
        if i in deep:
            cls = "reasoning"
            factor = rng_len.uniform(reasoning_min_factor, reasoning_max_factor)
            o = clip_len(o * factor, 1, max_output_len)
        out.append(
            WorkloadRequest(
                f"rm-{i}", t, p, o, request_class=cls, prompt_seed=f"{seed}:reasoning-mix:{i}"
            )
        )
    return out


def multi_tenant(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = INF,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    num_users: int = 4,
    flood_share: float = 0.7,
    max_prompt_len: int = 2048,
    max_output_len: int = 2048,
) -> list[WorkloadRequest]:
    """Several users with chat-like requests; "flood" sends `flood_share` of the traffic, the
    light users ("user-1", ...) share the rest equally. `request_class` is the user's name."""
    _check_common(num_requests, length_scale)
    if num_users < 2:
        raise HeddleError(f"multi-tenant needs num_users >= 2, got {num_users}")
    rng_t, rng_len = streams(seed, "multi-tenant")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    floods = pick_share(rng_len, num_requests, flood_share, "flood_share")
    light = [f"user-{k}" for k in range(1, num_users)]
    out = []
    num_light = 0
    for i, t in enumerate(times):
        if i in floods:
            user = "flood"
        else:
            user = light[num_light % len(light)]
            num_light += 1
        p = lognormal_len(
            rng_len, CHAT_PROMPT_MEAN, CHAT_PROMPT_SIGMA, length_scale, 4, max_prompt_len
        )
        o = lognormal_len(
            rng_len, CHAT_OUTPUT_MEAN, CHAT_OUTPUT_SIGMA, length_scale, 4, max_output_len
        )
        out.append(
            WorkloadRequest(
                f"mt-{i}",
                t,
                p,
                o,
                request_class=user,
                user=user,
                prompt_seed=f"{seed}:multi-tenant:{i}",
            )
        )
    return out
