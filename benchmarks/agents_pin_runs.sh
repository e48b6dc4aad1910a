#!/usr/bin/env bash
# The pin points of docs/AGENTS.md ("A heavier tool tail"): the fixed 2 s pin (fcfs:ttl) against
# fcfs:cost+tier over 1,080 programs, SWE-like, with the tools' tail made heavier
# (tool_sigma_scale=1.5: every tool's lognormal sigma x1.5 at the same median), one JSON per
# point in HEAVY (resumable). Virtual clock: run it with tools/bg.
#   bash benchmarks/agents_pin_runs.sh [HEAVY]
# then: python benchmarks/agents_sessions.py windows --base fcfs+ttl --every 180 --at 1.2 HEAVY/*.json
set -u
cd "$(dirname "$0")/.."
HEAVY=${1:-results/pin-heavy}
mkdir -p "$HEAVY"
if [ ! -e "$HEAVY/jobs.txt" ]; then  # in the order they ran
  for LS in "0.40 1" "0.40 2" "0.35 1" "0.30 1" "0.30 2" "0.35 2"; do
    for C in fcfs:ttl fcfs:cost+tier; do
      echo "${LS% *} 1080 ${LS#* } $C tool_sigma_scale=1.5"; done; done > "$HEAVY/jobs.txt"
fi
bash benchmarks/agents_horizon_runs.sh "$HEAVY" "$HEAVY/jobs.txt"
