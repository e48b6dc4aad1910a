#!/usr/bin/env bash
# Every timed figure of docs/VIEW.md in one bench slot (about 10 minutes on the 2-core box):
#   SLOT_END=00:33:50 /work/tools/bench benchmarks/view_slot.sh
# 1. benchmarks/view_overhead.py: a real `heddle serve` at 64 streams, dashboard open vs closed
#    (3 rounds per arm of 96 requests), and the page's lag split into its parts; with
#    ISOLATE=1 (the default) --isolate-cpus: the engine core alone on one CPU, the front end,
#    the bench client and Chromium on the other, in both arms;
# 2. benchmarks/events_cost.py: decision events on vs off on the simulator's hot path, one arm
#    at a time, alternating (5 pairs), at 40,000, 20,000 and 10,000 chat requests, in the time
#    left (PARALLEL=1: each pair's arms at once, one per CPU). Output under results/ (the logs
#    beside the JSON).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/tools/py}
# Seconds for the whole script: until SLOT_END (UTC, e.g. 20:44:50) if given, else BUDGET.
if [ -n "${SLOT_END:-}" ]; then
    BUDGET=$(( $(date -u -d "$SLOT_END" +%s) - $(date -u +%s) ))
fi
BUDGET=${BUDGET:-560}
echo "budget ${BUDGET} s"
mkdir -p results
start=$SECONDS
date -u +"view_slot start %T"
isolate=()
[ "${ISOLATE:-1}" = 1 ] && isolate=(--isolate-cpus)
parallel=()
[ "${PARALLEL:-0}" = 1 ] && parallel=(--parallel)
timeout "${OVERHEAD_S:-170}" "$PY" benchmarks/view_overhead.py --rounds "${ROUNDS:-3}" \
    --num-requests "${NUM_REQUESTS:-96}" "${isolate[@]}" --output results/view_overhead.json \
    2>&1 | tee results/view_overhead.log
left=$((BUDGET - (SECONDS - start)))
date -u +"view_overhead done %T; $left s left for events_cost"
timeout "$left" "$PY" benchmarks/events_cost.py "${parallel[@]}" --repeats "${REPEATS:-5}" \
    --rate 27.275639319603314 --num-requests ${LENGTHS:-40000 20000 10000} \
    --output results/events_cost.json 2>&1 | tee results/events_cost.log
date -u +"view_slot end %T"
