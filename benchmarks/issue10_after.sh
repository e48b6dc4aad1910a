#!/usr/bin/env bash
# Issue 10's second timed run, after benchmarks/serve_vs_llamacpp.py's sweep (one command, ~12 min):
#   /work/tools/bench bash benchmarks/issue10_after.sh [BEFORE_DIR] [LLAMA_SERVER]
# 1. TTFT at a 512-token prompt, one stream: heddle before (BEFORE_DIR, a `git archive` of main
#    before the change) and after, and llama-server, side by side;
# 2. offline throughput against transformers (32 requests, static batches of 32);
# 3. simulator fidelity with a cost model profiled on this tree's executor.
set -u
BEFORE=${1:-/tmp/heddle-before}
LLAMA=${2:-/work/llama-build/build/bin/llama-server}
PY=${PY:-/work/tools/py}
lscpu | grep -E "Model name|Flags" | cut -c1-400
$PY benchmarks/serve_vs_llamacpp.py --heddle-before "$BEFORE" --llama-server "$LLAMA" \
  --concurrency 1 --input-len 512 --output-len 16 --min-requests 8 --skip-long \
  --max-duration 120 --output-dir results/ttft512
$PY benchmarks/offline_throughput.py --num-requests 32 --batch-size 32 \
  --output results/offline_throughput.json
$PY benchmarks/sim_fidelity.py --num-requests 30 --runs 1 --rates 1.0,2.5 \
  --output results/sim_fidelity.json
