"""The second KV tier's copy rate on the real engine: the executor's blocks (every layer, K and
V) copied out of the paged KV cache into the tier's buffer and back (heddle/model/tier.py).

    python benchmarks/tier_copy.py --blocks 16,64,256 --repeats 5

Prints the block size in bytes and, per batch size, the median GB/s out and in; the figure the
`cpu-2core` hardware spec's `host_bandwidth` takes. Wall time: run under tools/bench.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    sizes = [int(b) for b in args.blocks.split(",")]
    cache = CacheConfig(block_size=args.block_size, num_blocks=2 * max(sizes),
                        offload_blocks=max(sizes))
    executor = ModelExecutor(ModelConfig(num_threads=args.threads), cache)
    tier = executor.tier
    assert tier is not None
    print(f"# {' '.join(sys.argv)}; {executor.model_name} {executor.dtype}, block of "
          f"{args.block_size} tokens = {tier.block_bytes} bytes over {len(executor.kv_caches)} "
          f"layers; {args.threads} threads")
    for n in sizes:
        out_rates, in_rates = [], []
        pairs = [(max(sizes) + i, i) for i in range(n)]  # pool block, slot
        back = [(i, i) for i in range(n)]  # slot, another pool block
        for _ in range(args.repeats):
            start = time.perf_counter()
            tier.copy(executor.kv_caches, pairs, [])
            out_rates.append(n * tier.block_bytes / (time.perf_counter() - start))
            start = time.perf_counter()
            tier.copy(executor.kv_caches, [], back)
            in_rates.append(n * tier.block_bytes / (time.perf_counter() - start))
        print(f"{n} blocks ({n * tier.block_bytes / 1e6:.1f} MB): out "
              f"{statistics.median(out_rates) / 1e9:.2f} GB/s, in "
              f"{statistics.median(in_rates) / 1e9:.2f} GB/s (median of {args.repeats})")


if __name__ == "__main__":
    main()
