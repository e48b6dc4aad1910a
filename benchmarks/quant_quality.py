"""Quality of the quantized paths against the unquantized model (same dtype), one run.

    .venv/bin/python benchmarks/quant_quality.py [--dtype auto] [--modes auto int8 int4]
        [--text FILE] [--new-tokens 32] [--float-kinds lm_head]

A mode is `MODE[:DTYPE][+KIND...]`: `none:float32` is the unquantized model in float32 (how far
two float roundings of the same weights already differ: the noise floor of every measure below);
`int4+lm_head` is int4 with the LM head kept on the float path (any kind: qkv, o, gate_up,
down, lm_head). `--float-kinds` adds kinds kept float to every mode.

1. Greedy agreement, free-running: the parity prompts of tests/model/test_smollm_vs_transformers.py,
   32 new tokens each, run as one continuous batch (tests/model/driver.py); the share of
   positions whose token equals the unquantized model's, position by position and up to each
   prompt's first difference (after a difference the two continue from different text).
2. Greedy agreement, teacher-forced: each prompt alone, followed one token per step by the
   reference's own greedy continuation; the share of positions where the mode's argmax equals
   the reference's argmax on the same text (each step has one row, so `auto` runs its
   quantized kernels; a near-tie flip counts once instead of derailing the rest of the text).
3. Perplexity (with --text): the file's tokens fed one token per step, and the share of
   positions whose argmax equals the reference's on that text.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.device import cpu_description
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams
from tests.model.driver import generate
from tests.model.test_smollm_vs_transformers import CHAT, PROMPTS


def executor_for(dtype: str, mode: str, num_blocks: int, threads: int | None = None,
                 float_kinds: frozenset[str] = frozenset()) -> ModelExecutor:
    return ModelExecutor(ModelConfig(dtype=dtype, quantization=mode, num_threads=threads),
                         CacheConfig(block_size=16, num_blocks=num_blocks),
                         float_kinds=float_kinds)


def prompt_ids(executor: ModelExecutor) -> list[list[int]]:
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    ids = [tokenizer.encode(p) for p in PROMPTS]
    ids += [tokenizer.encode(tokenizer.apply_chat_template(m)) for m in CHAT]
    return ids


def forced_argmax(executor: ModelExecutor, tokens: list[int], start: int) -> list[int]:
    """The argmax after each of tokens[start - 1:-1] (tokens[:start] as one prefill step, then
    one token per step through the paged cache): the model's guess for each of tokens[start:]."""
    return [int(logits.argmax()) for logits in _forced_logits(executor, tokens[:-1], start)]


def _forced_logits(executor: ModelExecutor, tokens: list[int], start: int) -> Iterator[torch.Tensor]:
    block_size = executor.block_size
    table = list(range((len(tokens) + block_size - 1) // block_size))
    new = NewRequest("forced", list(tokens), len(tokens), table, SamplingParams(temperature=0.0))
    position, step = 0, 0
    for end in range(start, len(tokens) + 1):
        builder = OutputBuilder(step)
        builder.add("forced", position, end - position, True, num_prompt_tokens=len(tokens),
                    new_request=new if step == 0 else None)
        yield executor.compute_logits(builder.build())["forced"]
        position, step = end, step + 1
    executor.execute(OutputBuilder(step).build(finished_request_ids=["forced"]))


def perplexity(executor: ModelExecutor, tokens: list[int]) -> tuple[float, list[int]]:
    """exp(mean NLL) of tokens[1:], one token per step through the paged cache, and the argmax
    after each of tokens[:-1]."""
    nll, argmax = 0.0, []
    for position, logits in enumerate(_forced_logits(executor, tokens[:-1], 1)):
        nll -= torch.log_softmax(logits, dim=-1)[tokens[position + 1]].item()
        argmax.append(int(logits.argmax()))
    return math.exp(nll / (len(tokens) - 1)), argmax


def agreement(want: list[list[int]], have: list[list[int]]) -> tuple[float, float]:
    """Percent of equal tokens by position, and before each sequence's first difference."""
    same = prefix = 0
    for w, h in zip(want, have, strict=True):
        same += sum(a == b for a, b in zip(w, h, strict=True))
        for a, b in zip(w, h, strict=True):
            if a != b:
                break
            prefix += 1
    total = sum(len(w) for w in want)
    return 100 * same / total, 100 * prefix / total


@dataclass(frozen=True, slots=True)
class Mode:
    quantization: str
    dtype: str
    float_kinds: frozenset[str]

    @staticmethod
    def parse(text: str, default_dtype: str, float_kinds: frozenset[str]) -> Mode:
        head, *kinds = text.split("+")
        quantization, _, dtype = head.partition(":")
        return Mode(quantization, dtype or default_dtype, float_kinds | frozenset(kinds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--modes", nargs="+", default=["auto", "int8", "int4"],
                        help="MODE[:DTYPE][+KIND...], e.g. int4, none:float32, int8+lm_head")
    parser.add_argument("--float-kinds", nargs="*", default=[],
                        help="linear kinds kept unquantized in every mode")
    parser.add_argument("--text", default=None, help="a text file for perplexity")
    parser.add_argument("--max-text-tokens", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    print(cpu_description(), f"torch {torch.__version__}", flush=True)

    reference = executor_for(args.dtype, "none", 1024, args.threads)
    prompts = prompt_ids(reference)
    expected = generate(reference, prompts, args.new_tokens)
    forced_texts = [p + e for p, e in zip(prompts, expected, strict=True)]
    expected_forced = [forced_argmax(reference, t, len(p)) for t, p in
                       zip(forced_texts, prompts, strict=True)]
    text_tokens, text_argmax = None, []
    if args.text:
        tokenizer = reference.tokenizer
        assert tokenizer is not None
        with open(args.text, encoding="utf-8") as f:
            text_tokens = tokenizer.encode(f.read())[: args.max_text_tokens]
        ppl, text_argmax = perplexity(reference, text_tokens)
        print(f"none ({reference.dtype}): perplexity {ppl:.3f} over {len(text_tokens)} tokens",
              flush=True)
    del reference
    for spec in args.modes:
        mode = Mode.parse(spec, args.dtype, frozenset(args.float_kinds))
        executor = executor_for(mode.dtype, mode.quantization, 1024, args.threads,
                                mode.float_kinds)
        by_position, before_difference = agreement(expected, generate(executor, prompts,
                                                                      args.new_tokens))
        forced = [forced_argmax(executor, t, len(p)) for t, p in
                  zip(forced_texts, prompts, strict=True)]
        forced_same, _ = agreement(expected_forced, forced)
        floats = "+".join(sorted(mode.float_kinds)) or "-"
        line = (f"{spec} ({executor.dtype}, {executor.quantization}; float kinds {floats}): "
                f"free-running greedy = reference {by_position:.1f}% by position, "
                f"{before_difference:.1f}% before the first difference; teacher-forced argmax "
                f"= reference {forced_same:.1f}% ({len(prompts)} prompts x {args.new_tokens})")
        if text_tokens is not None:
            ppl, argmax = perplexity(executor, text_tokens)
            text_same, _ = agreement([text_argmax], [argmax])
            line += f"; perplexity {ppl:.3f}, text argmax = reference {text_same:.1f}%"
        print(line, flush=True)
        del executor


if __name__ == "__main__":
    main()
