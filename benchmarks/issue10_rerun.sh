#!/usr/bin/env bash
# Issue 10, third pass: one timed run (~10 min on 2 cores), everything side by side:
#   /work/tools/bench bash benchmarks/issue10_rerun.sh BEFORE_DIR LLAMA_SERVER [LEVEL_GROUPS...]
# BEFORE_DIR: a checkout of main before the change (`git worktree add /tmp/heddle-before REV`),
# run with the same venv.
# 1. the decode step (decode_microbench.py, bf16, --quantization auto, 256-token contexts):
#    now, each step fused and eager alternating in one process (--compare-fused; the eager
#    path is the code path before the change), then heddle-before's own microbenchmark; and
#    the streaming read bandwidth (the weight-bytes floor);
# 2. linear_rows.py: the step's projections per kernel and row count (where int4 / int8 / bf16
#    cross over: the 8-stream dip);
# 3. serve_vs_llamacpp.py per group of stream counts (default "1,2,4,8" capped at 60 s per
#    level, then "32,64" capped at 150 s per level, enough for llama-server to finish: one
#    report each, so a run cut short keeps the first): heddle now, heddle before and
#    llama-server, one server at a time.
# auto's kernel plan is timed once here, on the quiet machine, by the first executor of this
# tree, cached in a fresh HEDDLE_TUNING_CACHE and reused by every later process (same key:
# both trees run the same kernels).
set -u
BEFORE=${1:-/tmp/heddle-before}
LLAMA=${2:-/work/llama-build/build/bin/llama-server}
shift 2 2>/dev/null
LEVEL_GROUPS=${*:-1,2,4,8 32,64}
PY=${PY:-/work/tools/py}
VENV_PY=${VENV_PY:-/work/main/.venv/bin/python}
HEDDLE_TUNING_CACHE=$(mktemp -d /tmp/heddle-tuning-XXXXXX)
export HEDDLE_TUNING_CACHE
trap 'rm -rf "$HEDDLE_TUNING_CACHE"' EXIT
date -u
lscpu | grep -E "Model name|Flags" | cut -c1-400
bandwidth() {
  $PY -c "
import time, torch
x = torch.ones(256 << 20); x.sum()
t = time.perf_counter(); [x.sum() for _ in range(5)]
print(f'streaming read: {5 * x.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (1 GB)')"
}
bandwidth
echo "=== decode step, NOW ($(git rev-parse --short HEAD)): fused vs eager, alternating"
$PY benchmarks/decode_microbench.py --dtypes bfloat16 --quantizations auto --batches 1 4 8 16 \
  --context 256 --steps 20 --threads 2 --compare-fused
echo "=== decode step, BEFORE ($BEFORE)"
(cd "$BEFORE" && PYTHONPATH="$BEFORE" $VENV_PY benchmarks/decode_microbench.py --dtypes bfloat16 \
  --quantizations auto --batches 1 8 --context 256 --steps 20 --threads 2)
bandwidth
$PY -m heddle.model.tuning_cache
echo "=== linear layers per kernel and row count"
$PY benchmarks/linear_rows.py --rows 1 2 4 8 16 --rounds 5 --threads 2
date -u
for group in $LEVEL_GROUPS; do
  cap=60
  [ "${group%%,*}" -ge 16 ] && cap=150
  # shellcheck disable=SC2086
  $PY benchmarks/serve_vs_llamacpp.py --heddle-before "$BEFORE" --llama-server "$LLAMA" \
    --concurrency ${group//,/ } --skip-long --max-duration $cap --threads 2 \
    --output-dir "results/issue10_rerun3/c${group//,/-}"
  date -u
done
