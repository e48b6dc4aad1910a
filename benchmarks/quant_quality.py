"""Quality of the quantized paths against the unquantized model (same dtype), one run.

    .venv/bin/python benchmarks/quant_quality.py [--dtype auto] [--modes auto int8 int4]
        [--reference none:float32] [--reference-cache JSON] [--text FILE] [--new-tokens 32] [--float-kinds lm_head]

A mode is `MODE[:DTYPE][+KIND...]`: `none:float32` is the unquantized model in float32 (how far
two float roundings of the same weights already differ: the noise floor of every measure below);
`int4+lm_head` is int4 with the LM head kept on the float path (any kind: qkv, o, gate_up,
down, lm_head). `--float-kinds` adds kinds kept float to every mode. `--reference` is the mode
every other one is compared with (default: `none` at `--dtype`); `--reference none:float32`
compares each mode with the file's weights in float32, the exact model a Q4_1 / Q8_0 file
describes (bf16 rounds those weights, so bf16 `none` is itself an approximation of it).

1. Greedy agreement, free-running: the parity prompts of tests/model/test_smollm_vs_transformers.py,
   32 new tokens each, run as one continuous batch (tests/model/driver.py); the share of
   positions whose token equals the unquantized model's, position by position and up to each
   prompt's first difference (after a difference the two continue from different text).
   Also each prompt alone (batch 1: every step has one row, so `auto` runs its quantized
   kernels at every step, as at one stream).
2. Greedy agreement, teacher-forced: each prompt alone, followed one token per step by the
   reference's own greedy continuation; the share of positions where the mode's argmax equals
   the reference's argmax on the same text (each step has one row, so `auto` runs its
   quantized kernels; a near-tie flip counts once instead of derailing the rest of the text).
3. Perplexity (with --text): the file's tokens fed one token per step, and the share of
   positions whose argmax equals the reference's on that text.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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


def reference_outputs(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The reference mode's tokens and argmaxes for every measure; with --reference-cache, read
    from that JSON file when it was made with the same arguments, else computed and written
    there (so modes can run one per process, each under a time limit)."""
    key = {"reference": args.reference, "dtype": args.dtype, "new_tokens": args.new_tokens,
           "text": args.text, "max_text_tokens": args.max_text_tokens, "threads": args.threads}
    if args.reference_cache and os.path.exists(args.reference_cache):
        with open(args.reference_cache, encoding="utf-8") as f:
            cached = json.load(f)
        if cached["key"] == key:
            print(f"reference: {args.reference} from {args.reference_cache}: "
                  f"{cached['summary']}", flush=True)
            return cached["outputs"]  # type: ignore[no-any-return]
    ref_mode = Mode.parse(args.reference, args.dtype, frozenset())
    reference = executor_for(ref_mode.dtype, ref_mode.quantization, 1024, args.threads,
                             ref_mode.float_kinds)
    summary = f"{reference.dtype}, {reference.quantization}"
    prompts = prompt_ids(reference)
    expected = generate(reference, prompts, args.new_tokens)
    outputs: dict[str, list[Any]] = {
        "prompts": prompts, "expected": expected,
        "expected_alone": [generate(reference, [p], args.new_tokens)[0] for p in prompts],
        "expected_forced": [forced_argmax(reference, p + e, len(p))
                            for p, e in zip(prompts, expected, strict=True)],
        "text_tokens": [], "text_argmax": [],
    }
    if args.text:
        tokenizer = reference.tokenizer
        assert tokenizer is not None
        with open(args.text, encoding="utf-8") as f:
            text_tokens = tokenizer.encode(f.read())[: args.max_text_tokens]
        ppl, outputs["text_argmax"] = perplexity(reference, text_tokens)
        outputs["text_tokens"] = text_tokens
        summary += f"; perplexity {ppl:.3f} over {len(text_tokens)} tokens"
    print(f"reference: {args.reference} ({summary})", flush=True)
    if args.reference_cache:
        with open(args.reference_cache, "w", encoding="utf-8") as f:
            json.dump({"key": key, "summary": summary, "outputs": outputs}, f)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--reference", default="none",
                        help="the mode compared with (MODE[:DTYPE]); default none at --dtype")
    parser.add_argument("--reference-cache", default=None, metavar="JSON",
                        help="keep the reference's outputs in this file (made once, then read)")
    parser.add_argument("--modes", nargs="*", default=["auto", "int8", "int4"],
                        help="MODE[:DTYPE][+KIND...], e.g. int4, none:float32, int8+lm_head")
    parser.add_argument("--float-kinds", nargs="*", default=[],
                        help="linear kinds kept unquantized in every mode")
    parser.add_argument("--text", default=None, help="a text file for perplexity")
    parser.add_argument("--max-text-tokens", type=int, default=4096)
    parser.add_argument("--skip-perplexity", action="store_true",
                        help="the modes' perplexity is not measured (the reference's is)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--measures", nargs="+", default=["batch", "alone", "forced"],
                        choices=["batch", "alone", "forced"],
                        help="which greedy agreements to measure for each mode")
    args = parser.parse_args()
    print(cpu_description(), f"torch {torch.__version__}", flush=True)

    ref = reference_outputs(args)
    prompts, expected, expected_alone = ref["prompts"], ref["expected"], ref["expected_alone"]
    expected_forced, text_argmax = ref["expected_forced"], ref["text_argmax"]
    forced_texts = [p + e for p, e in zip(prompts, expected, strict=True)]
    text_tokens = ref["text_tokens"] if args.text and not args.skip_perplexity else None
    for spec in args.modes:
        mode = Mode.parse(spec, args.dtype, frozenset(args.float_kinds))
        started = time.perf_counter()
        executor = executor_for(mode.dtype, mode.quantization, 1024, args.threads,
                                mode.float_kinds)
        parts = [f"{spec} ({executor.dtype}, {executor.quantization}; float kinds "
                 f"{'+'.join(sorted(mode.float_kinds)) or '-'}):"]
        if "batch" in args.measures:
            same, prefix = agreement(expected, generate(executor, prompts, args.new_tokens))
            parts.append(f"free-running greedy (one batch) = reference {same:.1f}% by position, "
                         f"{prefix:.1f}% before the first difference;")
        if "alone" in args.measures:
            same, prefix = agreement(expected_alone, [
                generate(executor, [p], args.new_tokens)[0] for p in prompts])
            parts.append(f"alone (batch 1) {same:.1f}% / {prefix:.1f}%;")
        if "forced" in args.measures:
            same, _ = agreement(expected_forced, [
                forced_argmax(executor, t, len(p)) for t, p in
                zip(forced_texts, prompts, strict=True)])
            parts.append(f"teacher-forced argmax = reference {same:.1f}%;")
        line = " ".join(parts) + f" ({len(prompts)} prompts x {args.new_tokens})"
        if text_tokens is not None:
            ppl, argmax = perplexity(executor, text_tokens)
            text_same, _ = agreement([text_argmax], [argmax])
            line += f"; perplexity {ppl:.3f}, text argmax = reference {text_same:.1f}%"
        print(line + f" [{time.perf_counter() - started:.0f} s]", flush=True)
        del executor


if __name__ == "__main__":
    main()
