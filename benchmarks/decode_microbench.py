"""Decode step time of the ModelExecutor: batch sizes x dtypes, at a fixed context length.

    .venv/bin/python benchmarks/decode_microbench.py [--dtypes float32 bfloat16]
        [--quantizations none auto int8 int4] [--batches 1 8 32 64] [--context 300]
        [--steps 10] [--threads N] [--compare-fused] [--compare-lm-head bf16 int8 int4 int8g]

Each request has `context` tokens in the paged KV cache (their values do not matter for
timing) and decodes one token per step; the step includes input building, the forward pass,
the lm_head for every row and greedy sampling. Prints the median step time and tokens/s.

--compare-fused runs every step twice, once with the fused decode layers (heddle.model.
fused_decode, the default) and once eagerly, alternating in one process on the same requests,
and prints both medians and their ratio; it also counts the top-level torch ops of one step
each way (torch.profiler).

--compare-lm-head runs every step once per LM head kernel (bf16: the float path; int8: torch's
int8 per output channel, what `auto` may choose; int4: min/max per group of 32, quantized here
for this comparison; int8g: 8-bit in groups of 32, what `int8` / `int4` run), rotating which
goes first, in one process on the same requests; the rest of the step is what the executor's
mode runs. Prints each kernel's median step time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
from heddle.model.layers import Linear
from heddle.model.linear_plan import LinearLayer
from heddle.model.quant import (
    GroupInt8Linear,
    Int4Linear,
    Int8Linear,
    quantize_int4_blocks,
    quantize_int8_blocks,
)
from heddle.request import SamplingParams


class DecodeBatch:
    """`batch` requests with `context` tokens in the cache, decoding one token per step through
    the executor's contract (sent once as new requests, then only their rows)."""

    def __init__(self, executor: ModelExecutor, batch: int, context: int, steps: int) -> None:
        self.executor, self.batch, self.context = executor, batch, context
        self.ids = [f"b{batch}-r{i}" for i in range(batch)]
        per_request = (context + steps + 2 + executor.block_size - 1) // executor.block_size
        params = SamplingParams(temperature=0.0)
        self.pending = [
            NewRequest(rid, [100 + i] * (context + 1), context + 1,
                       list(range(i * per_request, (i + 1) * per_request)), params)
            for i, rid in enumerate(self.ids)
        ]
        self.step_id = 0

    def step(self, advance: bool = True) -> float:
        """One decode step; `advance=False` forgets its tokens, so the next step computes the
        same positions again (to time two ways of computing one step)."""
        builder = OutputBuilder(self.step_id)
        new = {n.request_id: n for n in self.pending}
        for rid in self.ids:
            builder.add(rid, self.context + self.step_id, 1, True,
                        num_prompt_tokens=self.context + 1, new_request=new.get(rid))
        self.pending = []
        start = time.perf_counter()
        self.executor.execute(builder.build())
        elapsed = time.perf_counter() - start
        if advance:
            self.step_id += 1
        else:
            for rid in self.ids:
                self.executor._requests[rid].token_ids.pop()
        return elapsed

    def finish(self) -> None:
        self.executor.execute(OutputBuilder(self.step_id).build(finished_request_ids=self.ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quantizations", nargs="+", default=["none"],
                        help="auto | none | int8 | int4 (each run per dtype)")
    parser.add_argument("--compare-fused", action="store_true",
                        help="time each step fused and eager, alternating (see above)")
    parser.add_argument("--compare-lm-head", nargs="+", default=None,
                        choices=["bf16", "int8", "int4", "int8g"],
                        help="time each step with each LM head kernel, rotating (see above)")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    for dtype, quantization in ((d, q) for d in args.dtypes for q in args.quantizations):
        blocks = max(args.batches) * ((args.context + args.steps + 3) // 16 + 1)
        executor = ModelExecutor(
            ModelConfig(model=args.model, dtype=dtype, num_threads=args.threads,
                        quantization=quantization),
            CacheConfig(block_size=16, num_blocks=blocks),
        )
        weights = executor.model.weight_bytes
        print(f"{dtype} quantization={executor.quantization}: {weights / 1e6:.0f} MB of "
              "weights read per batch-1 step")
        for batch in args.batches:
            if args.compare_fused:
                compare_fused(executor, batch, args.context, args.steps, dtype, quantization)
                continue
            if args.compare_lm_head:
                compare_lm_heads(executor, batch, args.context, args.steps, args.compare_lm_head)
                continue
            run = DecodeBatch(executor, batch, args.context, args.steps + 1)
            run.step()  # warm-up (and the step that sends the new requests)
            times = [run.step() for _ in range(args.steps)]
            run.finish()
            median = statistics.median(times)
            print(
                f"{executor.model_name} {dtype:>8} {quantization:>4} batch {batch:>3} "
                f"ctx {args.context}: "
                f"{median * 1e3:8.1f} ms/step  {batch / median:8.1f} tok/s  "
                f"(min {min(times) * 1e3:.1f} ms)"
            )


def top_level_ops(run: DecodeBatch) -> int:
    """Top-level torch ops (not those inside other ops) of one step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run.step(advance=False)
    events = [e for e in prof.events() if e.name.startswith(("aten::", "mkldnn::"))]
    return sum(1 for e in events if e.cpu_parent is None
               or not e.cpu_parent.name.startswith(("aten::", "mkldnn::")))


def compare_fused(executor: ModelExecutor, batch: int, context: int, steps: int, dtype: str,
                  quantization: str) -> None:
    model = executor.model
    if model.fused is None:
        print(f"batch {batch}: no fused decode path here (no C kernels)")
        return
    run = DecodeBatch(executor, batch, context, steps + 2)
    run.step()  # sends the requests
    times: dict[bool, list[float]] = {True: [], False: []}
    ops = {}
    for fused in (True, False):
        model.fused_enabled = fused
        run.step(advance=False)  # warm-up of each path
        ops[fused] = top_level_ops(run)
    for i in range(steps):
        order = (True, False) if i % 2 == 0 else (False, True)
        for fused in order:  # both ways at the same positions, alternating which goes first
            model.fused_enabled = fused
            times[fused].append(run.step(advance=fused == order[1]))
    model.fused_enabled = True
    run.finish()
    fused_ms, eager_ms = (statistics.median(times[f]) * 1e3 for f in (True, False))
    print(f"{executor.model_name} {dtype:>8} {quantization:>4} batch {batch:>3} ctx {context}: "
          f"fused {fused_ms:7.2f} ms/step ({ops[True]} top-level ops), eager {eager_ms:7.2f} ms "
          f"({ops[False]} ops): eager / fused {eager_ms / fused_ms:.3f}x "
          f"(median of {steps} pairs)")


def compare_lm_heads(executor: ModelExecutor, batch: int, context: int, steps: int,
                     kernels: list[str]) -> None:
    model = executor.model
    if not model.spec.tie_word_embeddings:
        raise SystemExit("--compare-lm-head builds its LM heads from the tied embedding")
    weight, dtype = model.embed_tokens.float(), model.dtype
    heads: dict[str, LinearLayer] = {}
    for kernel in kernels:
        if kernel == "bf16":
            heads[kernel] = Linear(weight.to(dtype))
        elif kernel == "int8":
            heads[kernel] = Int8Linear(weight, dtype)
        elif kernel == "int4":
            heads[kernel] = Int4Linear(quantize_int4_blocks(weight), dtype)
        else:
            heads[kernel] = GroupInt8Linear(quantize_int8_blocks(weight), dtype)
    planned = model.lm_head
    run = DecodeBatch(executor, batch, context, steps + 2)
    run.step()  # sends the requests
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for kernel in kernels:  # warm-up of each
        model.lm_head = heads[kernel]
        run.step(advance=False)
    for i in range(steps):
        order = kernels[i % len(kernels):] + kernels[:i % len(kernels)]
        for kernel in order:
            model.lm_head = heads[kernel]
            times[kernel].append(run.step(advance=kernel == order[-1]))
    model.lm_head = planned
    run.finish()
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{executor.model_name} {executor.quantization} batch {batch:>3} ctx {context}, LM head "
          + ", ".join(f"{k} {medians[k]:.2f} ms/step" for k in kernels)
          + f" (median of {steps} rotations)")


if __name__ == "__main__":
    main()
