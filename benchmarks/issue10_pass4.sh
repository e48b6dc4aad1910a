#!/usr/bin/env bash
# Issue 10, fourth pass: one timed run (~6 min on 2 cores), everything side by side:
#   /work/tools/bench timeout 470 bash benchmarks/issue10_pass4.sh LLAMA_SERVER [OUT_DIR]
# 1. the kernel plan, timed here on the quiet machine into a fresh HEDDLE_TUNING_CACHE (shared
#    by every later process of this run), printed with the LM head's timings;
# 2. the batch-1 and 2 decode step with each LM head kernel, rotating in one process
#    (decode_microbench.py --compare-lm-head), and the plain batch-1 step of auto, int8, int4;
# 3. the linear layers per kernel and row count (linear_rows.py, with the grouped int8);
# 4. serve_vs_llamacpp.py at one stream: heddle (auto) and llama-server, one at a time.
set -u
LLAMA=${1:-/work/llama-build/build/bin/llama-server}
OUT=${2:-results/issue10_pass4}
PY=${PY:-/work/tools/py}
HEDDLE_TUNING_CACHE=$(mktemp -d /tmp/heddle-tuning-XXXXXX)
export HEDDLE_TUNING_CACHE
# At the end the plan timed here goes to $OUT and into this machine's default cache (a plan of
# the same key already there is kept), so later processes run what was timed quietly.
keep_plan() {
  cp "$HEDDLE_TUNING_CACHE"/plan-*.json "$OUT"/ 2>/dev/null
  dest=${XDG_CACHE_HOME:-$HOME/.cache}/heddle/tuning
  mkdir -p "$dest" && cp -n "$HEDDLE_TUNING_CACHE"/plan-*.json "$dest"/ 2>/dev/null
  rm -rf "$HEDDLE_TUNING_CACHE"
}
trap keep_plan EXIT
mkdir -p "$OUT"
date -u
$PY -c "from heddle.hostinfo import machine_line; print(machine_line())"
bandwidth() {
  $PY -c "
import time, torch
x = torch.ones(256 << 20); x.sum()
t = time.perf_counter(); [x.sum() for _ in range(5)]
print(f'streaming read: {5 * x.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (1 GB)')"
}
bandwidth
echo "=== decode step, LM head kernels rotating (the plan is tuned by this first executor)"
$PY benchmarks/decode_microbench.py --dtypes bfloat16 --quantizations auto --batches 1 2 \
  --context 256 --steps 30 --threads 2 --compare-lm-head bf16 int8 int4 int8g
$PY -m heddle.model.tuning_cache
$PY -c "
import json, pathlib, os
for p in pathlib.Path(os.environ['HEDDLE_TUNING_CACHE']).glob('plan-*.json'):
    d = json.loads(p.read_text())
    print('lm_head timings (us, quantized vs float):', d['timings_us'].get('lm_head'))"
echo "=== decode step per mode"
$PY benchmarks/decode_microbench.py --dtypes bfloat16 --quantizations auto int8 int4 \
  --batches 1 --context 256 --steps 30 --threads 2
bandwidth
date -u
echo "=== linear layers per kernel and row count"
$PY benchmarks/linear_rows.py --rows 1 2 4 8 --rounds 5 --threads 2
date -u
echo "=== serve_vs_llamacpp, one stream"
$PY benchmarks/serve_vs_llamacpp.py --llama-server "$LLAMA" --concurrency 1 --skip-long \
  --max-duration 60 --threads 2 --output-dir "$OUT/c1"
date -u
