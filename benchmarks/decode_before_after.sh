#!/usr/bin/env bash
# Decode step before (the main checkout at /work/main) and after (this tree), one run:
#   /work/tools/bench bash benchmarks/decode_before_after.sh
set -x
lscpu | grep -E "Model name|Flags" | cut -c1-400
/work/tools/py -c "
import time, torch
x = torch.ones(256 << 20); x.sum()
t = time.perf_counter(); [x.sum() for _ in range(5)]
print(f'streaming read: {5 * x.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (1 GB)')"
echo "=== BEFORE (main $(git -C /work/main rev-parse --short HEAD))"
PYTHONPATH=/work/main /work/main/.venv/bin/python /work/main/benchmarks/decode_microbench.py --dtypes bfloat16 float32 --batches 1 8 32 64 --context 256 --steps 10
echo "=== AFTER (speed $(git rev-parse --short HEAD) + worktree)"
/work/tools/py benchmarks/decode_microbench.py --dtypes bfloat16 --quantizations none auto int8 int4 --batches 1 8 32 64 --context 256 --steps 10
/work/tools/py benchmarks/decode_microbench.py --dtypes float32 --quantizations none --batches 1 8 32 64 --context 256 --steps 10
