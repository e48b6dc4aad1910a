#!/usr/bin/env bash
# The real-engine steady run of docs/AGENTS.md ("A steady run on the real engine"): fcfs+lru
# then plas+cost+tier on the embedded SmolLM2-135M, the SWE-like programs scaled as in the
# 40-program runs, seed 0, 280 programs at 0.85 programs/s (~330 s of arrivals per
# configuration), each server warmed up with 4 programs first. Under tools/bench (wall time):
#   tools/bench timeout 780 bash benchmarks/agents_serve_steady.sh results/agents-steady-real
# then judge each by its queue and compare with the sized simulator on the same programs:
#   python benchmarks/agents_sessions.py windows --every 50 --at 1.5 OUT/agents-serve-agent-swe.json
set -euo pipefail
OUT=${1:-results/agents-steady-real}
N=${N:-280}
RATE=${RATE:-0.85}
PY=${PY:-python}
exec "$PY" benchmarks/agents_serve.py --workload agent-swe --request-rate "$RATE" \
  --num-programs "$N" --repeats 1 --seed 0 --num-blocks 192 --max-num-seqs 8 \
  --offload-blocks 1024 --workload-option length_scale=0.3 --workload-option output_mean=15 \
  --workload-option tool_time_factor=0.3 --workload-option max_context_len=1400 \
  --workload-option turns_mean=8 --workload-option max_turns=10 \
  --warmup-programs "${WARMUP:-4}" --max-duration "${MAXDUR:-360}" --start-timeout 120 \
  --configs fcfs:lru,plas:cost+tier --output-dir "$OUT"
