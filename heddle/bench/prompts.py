"""Prompts for a workload's requests: synthetic token ids, or words that roughly hit a length.

Token ids are exact and what the simulator sees, but need a server that accepts them in
`prompt` (heddle, vLLM and llama.cpp's llama-server all do). Text works with any server; common
English words are one token each in most BPE vocabularies, so N words come to about N tokens.
"""

from __future__ import annotations

import random

from heddle.errors import HeddleError
from heddle.workloads import WorkloadRequest

PROMPT_MODES = ("tokens", "text")

_WORD_LINES = (
    "the of and to in is was for on that with as by at from his it an were are which",
    "this be or has had not but also first one their its new after who they two her",
    "she he all been have more when would there time only other into most over some",
    "city made world year can out these than may then where about many such used",
    "during him through them both people part well each while since name way state",
    "work team under between later found three known water long day game family best",
    "like could what last number found house great small high life place good left",
    "play line still back make right old take end little much land power before hand",
    "point light same story head music side form major large",
)
_WORDS = tuple(word for line in _WORD_LINES for word in line.split())


def text_prompt(num_words: int, seed: int | str) -> str:
    """`num_words` words drawn with a seed: roughly `num_words` tokens for most tokenizers."""
    rng = random.Random(f"text-{seed}")
    return " ".join(rng.choices(_WORDS, k=num_words))


def prompt_for(
    request: WorkloadRequest, mode: str, vocab_size: int, low_id: int = 100
) -> str | list[int]:
    """The `prompt` field of a /v1/completions request for this workload request."""
    if mode == "tokens":
        return list(request.prompt_ids(vocab_size, low=low_id))
    if mode == "text":
        return text_prompt(request.prompt_len, f"{request.request_id}-{request.prompt_seed}")
    raise HeddleError(f"unknown prompt mode {mode!r}; use {' or '.join(PROMPT_MODES)}")
