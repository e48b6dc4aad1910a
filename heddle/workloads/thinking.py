"""A reasoning model's traffic: requests that think before they answer, and requests that do not.

Three request classes, as three applications sharing one reasoning model would send:

- `chat`, 60%: no thinking (thinking off), answers of 340 tokens on average: ShareGPT-like
  chat (heddle's `chat` workload).
- `qa`, 25%: 1,100 thinking tokens, 200 answer tokens. Easy problems: QwQ-32B-Preview spends
  901 tokens on "2+3=?" (Chen et al. 2024, arXiv:2412.21187); 1,100 for GSM8K-level questions
  is this workload's choice.
- `math`, 15%: 12,000 thinking tokens, 600 answer tokens. Competition math: DeepSeek-R1
  averaged 12K tokens per AIME 2025 question (the DeepSeek-R1-0528 model card, which reports
  23K for the newer model).

Lengths are lognormal around those means (thinking sigma 0.5, answer sigma 0.6; the spreads and
the class shares are this workload's assumptions, not published figures), capped at 32,768
output tokens (DeepSeek-R1's evaluation limit). `thinking_len` counts the thinking tokens plus
the closing `</think>`; `output_len` is thinking plus answer. Prompts are chat-like (mean 160).
"""

from __future__ import annotations

import math
import random

from heddle.errors import HeddleError
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.request import WorkloadRequest
from heddle.workloads.synthetic import (
    CHAT_OUTPUT_MEAN,
    CHAT_PROMPT_MEAN,
    CHAT_PROMPT_SIGMA,
    clip_len,
    lognormal_len,
    streams,
)

MAX_OUTPUT_LEN = 32768
THINKING_SIGMA, ANSWER_SIGMA = 0.5, 0.6
# class -> (share, thinking mean, answer mean)
CLASSES: dict[str, tuple[float, float, float]] = {
    "chat": (0.60, 0.0, CHAT_OUTPUT_MEAN),
    "qa": (0.25, 1100.0, 200.0),
    "math": (0.15, 12000.0, 600.0),
}


def thinking_mix(
    seed: int = 0,
    num_requests: int = 100,
    rate: float = math.inf,
    arrival: str = "poisson",
    cv: float = 1.0,
    length_scale: float = 1.0,
    chat_share: float = CLASSES["chat"][0],
    qa_share: float = CLASSES["qa"][0],
    math_share: float = CLASSES["math"][0],
    max_prompt_len: int = 2048,
    max_output_len: int = MAX_OUTPUT_LEN,
) -> list[WorkloadRequest]:
    """Chat requests among requests that think first (classes chat / qa / math, see above)."""
    shares = {"chat": chat_share, "qa": qa_share, "math": math_share}
    if num_requests < 0 or length_scale <= 0:
        raise HeddleError("num_requests must be >= 0 and length_scale positive")
    if any(s < 0 for s in shares.values()) or not math.isclose(sum(shares.values()), 1.0):
        raise HeddleError(f"class shares must be >= 0 and sum to 1, got {shares}")
    rng_t, rng_len = streams(seed, "thinking-mix")
    times = arrival_times(arrival, rate, num_requests, rng_t, cv)
    classes = _assign(rng_len, num_requests, shares)
    out = []
    for i, (t, cls) in enumerate(zip(times, classes, strict=True)):
        _, thinking_mean, answer_mean = CLASSES[cls]
        prompt = lognormal_len(
            rng_len, CHAT_PROMPT_MEAN, CHAT_PROMPT_SIGMA, length_scale, 4, max_prompt_len
        )
        answer = lognormal_len(rng_len, answer_mean, ANSWER_SIGMA, length_scale, 4, max_output_len)
        thinking = 0
        if thinking_mean > 0:
            thinking = 1 + lognormal_len(
                rng_len, thinking_mean, THINKING_SIGMA, length_scale, 4, max_output_len
            )
            thinking = min(thinking, max_output_len - 1)
            answer = clip_len(answer, 1, max_output_len - thinking)
        out.append(
            WorkloadRequest(
                f"tm-{i}",
                t,
                prompt,
                thinking + answer,
                request_class=cls,
                prompt_seed=f"{seed}:thinking-mix:{i}",
                thinking_len=thinking,
            )
        )
    return out


def _assign(rng: random.Random, n: int, shares: dict[str, float]) -> list[str]:
    """Exactly round(share * n) requests per class (the rest to the first), shuffled."""
    counts = {cls: round(share * n) for cls, share in shares.items()}
    first = next(iter(shares))
    counts[first] += n - sum(counts.values())
    labels = [cls for cls, count in counts.items() for _ in range(max(0, count))]
    rng.shuffle(labels)
    return labels[:n]
