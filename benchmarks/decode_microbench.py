"""Decode step time of the ModelExecutor: batch sizes x dtypes, at a fixed context length.

    .venv/bin/python benchmarks/decode_microbench.py [--dtypes float32 bfloat16]
        [--quantizations none auto int8 int4] [--batches 1 8 32 64] [--context 300]
        [--steps 10] [--threads N]

Each request has `context` tokens in the paged KV cache (their values do not matter for
timing) and decodes one token per step; the step includes input building, the forward pass,
the lm_head for every row and greedy sampling. Prints the median step time and tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import ScheduledRequest, SchedulerOutput
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams


def decode_step(executor: ModelExecutor, batch: int, context: int, step_id: int) -> float:
    blocks_per_request = (context + 1 + executor.block_size - 1) // executor.block_size
    params = SamplingParams(temperature=0.0)
    scheduled = [
        ScheduledRequest(
            request_id=f"r{i}",
            token_ids=[100 + i],
            start_position=context,
            block_table=list(range(i * blocks_per_request, (i + 1) * blocks_per_request)),
            sample=True,
            sampling_params=params,
            num_prompt_tokens=context,
            num_output_tokens=1,
        )
        for i in range(batch)
    ]
    start = time.perf_counter()
    executor.execute(SchedulerOutput(step_id, scheduled))
    return time.perf_counter() - start


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
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    for dtype, quantization in ((d, q) for d in args.dtypes for q in args.quantizations):
        blocks = max(args.batches) * ((args.context + 16) // 16 + 1)
        executor = ModelExecutor(
            ModelConfig(model=args.model, dtype=dtype, num_threads=args.threads,
                        quantization=quantization),
            CacheConfig(block_size=16, num_blocks=blocks),
        )
        weights = executor.model.weight_bytes
        print(f"{dtype} quantization={executor.quantization}: {weights / 1e6:.0f} MB of "
              "weights read per batch-1 step")
        for batch in args.batches:
            decode_step(executor, batch, args.context, 0)  # warm-up
            times = [decode_step(executor, batch, args.context, s) for s in range(args.steps)]
            median = statistics.median(times)
            print(
                f"{executor.model_name} {dtype:>8} {quantization:>4} batch {batch:>3} "
                f"ctx {args.context}: "
                f"{median * 1e3:8.1f} ms/step  {batch / median:8.1f} tok/s  "
                f"(min {min(times) * 1e3:.1f} ms)"
            )


if __name__ == "__main__":
    main()
