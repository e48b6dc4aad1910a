"""Quality of the quantized paths against the unquantized model (same dtype), one run.

    .venv/bin/python benchmarks/quant_quality.py [--dtype auto] [--modes auto int8 int4]
        [--text FILE] [--new-tokens 32]

1. Greedy agreement: the parity prompts of tests/model/test_smollm_vs_transformers.py, 32 new
   tokens each, run as one continuous batch (tests/model/driver.py); the share of positions
   whose token equals the unquantized model's, counted up to each prompt's first difference
   (after a difference the two continue from different text) and also position by position.
2. Perplexity (with --text): the file's tokens fed one token per step, so every row count the
   decode path runs is the one measured (auto's quantized kernels run at few rows only).
"""

from __future__ import annotations

import argparse
import math

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams
from tests.model.driver import generate
from tests.model.test_smollm_vs_transformers import CHAT, PROMPTS


def executor_for(dtype: str, mode: str, num_blocks: int,
                 threads: int | None = None) -> ModelExecutor:
    return ModelExecutor(ModelConfig(dtype=dtype, quantization=mode, num_threads=threads),
                         CacheConfig(block_size=16, num_blocks=num_blocks))


def prompt_ids(executor: ModelExecutor) -> list[list[int]]:
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    ids = [tokenizer.encode(p) for p in PROMPTS]
    ids += [tokenizer.encode(tokenizer.apply_chat_template(m)) for m in CHAT]
    return ids


def perplexity(executor: ModelExecutor, tokens: list[int]) -> float:
    """exp(mean NLL) of tokens[1:], one token per step through the paged cache."""
    block_size = executor.block_size
    table = list(range((len(tokens) + block_size - 1) // block_size))
    new = NewRequest("ppl", list(tokens), len(tokens), table, SamplingParams(temperature=0.0))
    nll = 0.0
    for position in range(len(tokens) - 1):
        builder = OutputBuilder(position)
        builder.add("ppl", position, 1, True, num_prompt_tokens=len(tokens),
                    new_request=new if position == 0 else None)
        logits = executor.compute_logits(builder.build())["ppl"]
        nll -= torch.log_softmax(logits, dim=-1)[tokens[position + 1]].item()
    executor.execute(OutputBuilder(len(tokens)).build(finished_request_ids=["ppl"]))
    return math.exp(nll / (len(tokens) - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--modes", nargs="+", default=["auto", "int8", "int4"])
    parser.add_argument("--text", default=None, help="a text file for perplexity")
    parser.add_argument("--max-text-tokens", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()

    reference = executor_for(args.dtype, "none", 1024, args.threads)
    prompts = prompt_ids(reference)
    expected = generate(reference, prompts, args.new_tokens)
    text_tokens = None
    if args.text:
        tokenizer = reference.tokenizer
        assert tokenizer is not None
        with open(args.text, encoding="utf-8") as f:
            text_tokens = tokenizer.encode(f.read())[: args.max_text_tokens]
        print(f"none: perplexity {perplexity(reference, text_tokens):.3f} "
              f"over {len(text_tokens)} tokens", flush=True)
    del reference
    for mode in args.modes:
        executor = executor_for(args.dtype, mode, 1024, args.threads)
        got = generate(executor, prompts, args.new_tokens)
        same = prefix = 0
        for want, have in zip(expected, got, strict=True):
            same += sum(a == b for a, b in zip(want, have, strict=True))
            for a, b in zip(want, have, strict=True):
                if a != b:
                    break
                prefix += 1
        total = sum(len(w) for w in expected)
        line = (f"{mode} ({executor.quantization}): greedy tokens equal to none's "
                f"{100 * same / total:.1f}% by position, {100 * prefix / total:.1f}% before "
                f"the first difference ({len(prompts)} prompts x {args.new_tokens})")
        if text_tokens is not None:
            line += f"; perplexity {perplexity(executor, text_tokens):.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
