#!/usr/bin/env bash
# Issue 10, second pass: one timed run (~10 min on 2 cores), everything side by side:
#   /work/tools/bench bash benchmarks/issue10_rerun.sh BEFORE_DIR LLAMA_SERVER [LEVEL_GROUPS...]
# BEFORE_DIR: a `git archive` of main before the change (run with the same venv).
# 1. the decode step (decode_microbench.py, bf16, --quantization auto, 256-token contexts) of
#    heddle before and now, and the streaming read bandwidth (the weight-bytes floor);
# 2. serve_vs_llamacpp.py per group of stream counts (default "1,2,4,8" then "32,64": one report
#    each, so a run cut short keeps the first): heddle now, heddle before and llama-server, one
#    server at a time, each level capped at 60 s.
# auto's kernel plan is timed once here, on the quiet machine, by the first executor of this
# tree, cached in a fresh HEDDLE_TUNING_CACHE and reused by this tree's server (same key).
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
lscpu | grep -E "Model name|Flags" | cut -c1-400
$PY -c "
import time, torch
x = torch.ones(256 << 20); x.sum()
t = time.perf_counter(); [x.sum() for _ in range(5)]
print(f'streaming read: {5 * x.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (1 GB)')"
echo "=== decode step, BEFORE ($BEFORE)"
(cd "$BEFORE" && PYTHONPATH="$BEFORE" $VENV_PY benchmarks/decode_microbench.py --dtypes bfloat16 \
  --quantizations auto --batches 1 8 --context 256 --steps 20 --threads 2)
echo "=== decode step, NOW ($(git rev-parse --short HEAD))"
$PY benchmarks/decode_microbench.py --dtypes bfloat16 --quantizations auto --batches 1 8 \
  --context 256 --steps 20 --threads 2
$PY -m heddle.model.tuning_cache
for group in $LEVEL_GROUPS; do
  # shellcheck disable=SC2086
  $PY benchmarks/serve_vs_llamacpp.py --heddle-before "$BEFORE" --llama-server "$LLAMA" \
    --concurrency ${group//,/ } --skip-long --max-duration 60 --threads 2 \
    --output-dir "results/issue10_rerun/c${group//,/-}"
done
