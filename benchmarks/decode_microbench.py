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
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
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

    def step(self) -> float:
        builder = OutputBuilder(self.step_id)
        new = {n.request_id: n for n in self.pending}
        for rid in self.ids:
            builder.add(rid, self.context + self.step_id, 1, True,
                        num_prompt_tokens=self.context + 1, new_request=new.get(rid))
        self.pending = []
        self.step_id += 1
        start = time.perf_counter()
        self.executor.execute(builder.build())
        return time.perf_counter() - start

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


if __name__ == "__main__":
    main()
