"""Offline throughput: heddle's continuous batching vs transformers static batching, one run.

A seeded workload of N requests (prompts 64-512 tokens, outputs uniform in 16-512, ignore_eos)
runs through heddle and, in the same process, through transformers `generate` in static
batches of the same size (left padding, each batch runs until its longest output). Then heddle's
decode step time at batch 1, 8, 32, 64 is measured against two ceilings measured in the same run:
weight bytes / memory-copy bandwidth (batch 1) and GEMM FLOP/s (large batch). Also reported:
the share of step time spent outside the executor (scheduler + KV bookkeeping + outputs).

    .venv/bin/python benchmarks/offline_throughput.py --num-requests 64 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from heddle.engine.llm import LLM
from heddle.model.device import cpu_description
from heddle.request import SamplingParams


def make_workload(n: int, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(100, vocab) for _ in range(rng.randint(64, 512))], rng.randint(16, 512))
        for _ in range(n)
    ]


def run_heddle(llm: LLM, workload: list[tuple[list[int], int]]) -> dict[str, float]:
    engine = llm.engine
    for i, (prompt, out_len) in enumerate(workload):
        engine.add_request(
            f"h{i}", prompt, SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0)
        )
    engine.execute_seconds = engine.overhead_seconds = 0.0
    start = time.perf_counter()
    produced = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                produced += len(output.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    engine.check_integrity()
    return {
        "seconds": elapsed,
        "output_tokens": produced,
        "output_tokens_per_s": produced / elapsed,
        "overhead_share": engine.overhead_seconds
        / (engine.overhead_seconds + engine.execute_seconds),
    }


def run_transformers(
    model_path: str, dtype: torch.dtype, workload, batch_size: int
) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=dtype
    )
    model.eval()
    pad = 0
    useful = 0
    start = time.perf_counter()
    for b in range(0, len(workload), batch_size):
        batch = workload[b : b + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(n for _, n in batch)
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=longest,
                min_new_tokens=longest,
                pad_token_id=pad,
            )
        useful += sum(n for _, n in batch)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "output_tokens": useful, "output_tokens_per_s": useful / elapsed}


def decode_step_times(llm: LLM, batch: int, context: int, steps: int, vocab: int) -> float:
    """Median decode step time with `batch` requests of `context` tokens each."""
    engine = llm.engine
    rng = random.Random(batch)
    for i in range(batch):
        prompt = [rng.randrange(100, vocab) for _ in range(context)]
        engine.add_request(
            f"d{batch}-{i}", prompt, SamplingParams(max_tokens=steps + 8, ignore_eos=True)
        )
    engine.step_stats.clear()
    while engine.has_unfinished_requests():
        engine.step()
    decode = [
        s.duration
        for s in engine.step_stats
        if s.num_prefill_tokens == 0 and s.num_requests == batch
    ]
    return statistics.median(decode)


def memcpy_bandwidth() -> float:
    src = torch.empty(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() / min(times)  # read + write


def gemm_flops(dtype: torch.dtype, m: int = 64, k: int = 576, n: int = 1536) -> float:
    """GEMM FLOP/s at the shape of a batch-64 MLP projection of SmolLM2-135M."""
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    reps = 200
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * m * k * n * reps / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decode-batches", default="1,8,32,64")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--output", default="results/offline_throughput.json")
    args = parser.parse_args()

    llm = LLM(
        dtype=args.dtype,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=512,
        kv_cache_memory_gb=2.0,
    )
    executor = llm.engine.executor
    arch = executor.model_shape  # type: ignore[attr-defined]
    dtype = executor.dtype  # type: ignore[attr-defined]
    workload = make_workload(args.num_requests, args.seed, arch.vocab_size)
    result: dict[str, object] = {
        "machine": f"{cpu_description()}; {torch.get_num_threads()} threads",
        "dtype": str(dtype),
        "num_requests": args.num_requests,
        "batch_size": args.batch_size,
    }
    print(f"{result['machine']}; dtype {dtype}, quantization {executor.quantization}")
    heddle = run_heddle(llm, workload)
    result["heddle"] = heddle
    print(
        f"heddle:       {heddle['output_tokens_per_s']:8.1f} output tok/s  ({heddle['seconds']:.1f} s)"
    )
    if not args.skip_transformers:
        hf = run_transformers(executor.model_path, dtype, workload, args.batch_size)  # type: ignore[attr-defined]
        result["transformers"] = hf
        result["speedup"] = heddle["output_tokens_per_s"] / hf["output_tokens_per_s"]
        print(
            f"transformers: {hf['output_tokens_per_s']:8.1f} output tok/s  ({hf['seconds']:.1f} s)"
        )
        print(f"speedup:      {result['speedup']:.2f}x")

    batches = [int(b) for b in args.decode_batches.split(",")]
    llm_decode = LLM(
        dtype=args.dtype,
        max_num_seqs=max(batches),
        max_num_batched_tokens=2048,
        kv_cache_memory_gb=2.0,
    )
    bandwidth = memcpy_bandwidth()
    flops = gemm_flops(dtype)
    weight_bytes = llm_decode.engine.executor.model.weight_bytes  # type: ignore[attr-defined]
    rows = []
    for batch in batches:
        step = decode_step_times(llm_decode, batch, context=256, steps=24, vocab=arch.vocab_size)
        memory_floor = weight_bytes / bandwidth
        compute_floor = 2 * arch.num_params() * batch / flops
        rows.append(
            {
                "batch": batch,
                "step_ms": 1000 * step,
                "tokens_per_s": batch / step,
                "memory_floor_ms": 1000 * memory_floor,
                "compute_floor_ms": 1000 * compute_floor,
                "of_ceiling": max(memory_floor, compute_floor) / step,
            }
        )
        print(
            f"decode batch {batch:3d}: {1000 * step:7.1f} ms/step {batch / step:7.1f} tok/s | "
            f"floors: memory {1000 * memory_floor:.1f} ms, compute {1000 * compute_floor:.1f} ms"
        )
    overhead = llm_decode.engine.overhead_seconds / (
        llm_decode.engine.overhead_seconds + llm_decode.engine.execute_seconds
    )
    result.update(
        decode=rows,
        memcpy_gb_s=bandwidth / 1e9,
        gemm_gflop_s=flops / 1e9,
        weight_mb=weight_bytes / 1e6,
    )
    result["decode_overhead_share"] = overhead
    print(
        f"memcpy {bandwidth / 1e9:.1f} GB/s, GEMM {flops / 1e9:.1f} GFLOP/s, weights {weight_bytes / 1e6:.0f} MB"
    )
    print(
        f"time outside the executor: {100 * heddle['overhead_share']:.1f}% (workload), {100 * overhead:.1f}% (decode runs)"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
