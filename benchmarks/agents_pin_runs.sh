#!/usr/bin/env bash
# The pin points of docs/AGENTS.md ("Against the pin, heavy-tailed tools"): the fixed 2 s pin
# (fcfs:ttl) against fcfs:cost+tier over 1,080 programs, SWE-like, with the tools' tail made
# heavier (tool_sigma_scale=1.5: every tool's lognormal sigma x1.5 at the same median) in
# HEAVY, and the unchanged workload at 0.28 in BASE. Virtual clock: run it with tools/bg.
#   bash benchmarks/agents_pin_runs.sh [HEAVY] [BASE]
# then: python benchmarks/agents_sessions.py windows --base fcfs+ttl --every 180 --at 1.2 DIR/*.json
set -u
cd "$(dirname "$0")/.."
HEAVY=${1:-results/pin-heavy}
BASE=${2:-results/pin-base}
mkdir -p "$HEAVY" "$BASE"
if [ ! -e "$HEAVY/jobs.txt" ]; then  # in the order they ran
  for LS in "0.40 1" "0.40 2" "0.35 1" "0.30 1" "0.30 2" "0.35 2"; do
    for C in fcfs:ttl fcfs:cost+tier; do
      echo "${LS% *} 1080 ${LS#* } $C tool_sigma_scale=1.5"; done; done > "$HEAVY/jobs.txt"
fi
if [ ! -e "$BASE/jobs.txt" ]; then
  for S in 0 1 2; do for C in fcfs:cost+tier fcfs:ttl; do echo "0.28 1080 $S $C"; done; done \
    > "$BASE/jobs.txt"
fi
bash benchmarks/agents_horizon_runs.sh "$HEAVY" "$HEAVY/jobs.txt"
bash benchmarks/agents_horizon_runs.sh "$BASE" "$BASE/jobs.txt"
