#!/usr/bin/env bash
# Every timed figure of docs/VIEW.md in one bench slot (about 10 minutes on the 2-core box):
#   SLOT_END=02:33 /work/tools/bench bash benchmarks/view_slot.sh
# 1. benchmarks/view_overhead.py: a real `heddle serve` at 64 streams, dashboard open vs closed
#    (ROUNDS rounds per arm of NUM_REQUESTS requests, alternating; a warm-up of one full batch
#    first), and the page's lag split into its parts; with ISOLATE=1 (the default)
#    --isolate-cpus: the engine core alone on one CPU, the front end, the bench client and
#    Chromium on the other, in both arms. It writes its rounds as they finish (a cut run keeps
#    them).
# 2. benchmarks/events_cost.py: decision events on vs off on the simulator's hot path, one arm
#    at a time, the order changing every pair (REPEATS pairs), at each of LENGTHS chat
#    requests (PARALLEL=1: each pair's arms at once, one per CPU);
# 3. in the time left, events_cost.py --probe at PROBE_LENGTH: a third arm, the view's probe as
#    an engine core runs it (its rows and events encoded after every step, page open or not).
# Output under results/ (the logs beside the JSON).
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
timeout "${OVERHEAD_S:-240}" "$PY" benchmarks/view_overhead.py --rounds "${ROUNDS:-3}" \
    --num-requests "${NUM_REQUESTS:-64}" --warmup-output-len "${WARMUP_OUTPUT_LEN:-16}" \
    "${isolate[@]}" --output results/view_overhead.json 2>&1 | tee results/view_overhead.log
left=$((BUDGET - (SECONDS - start) - ${PROBE_S:-40}))
date -u +"view_overhead done %T; $left s left for events_cost"
if [ "$left" -gt 10 ]; then
    timeout "$left" "$PY" benchmarks/events_cost.py "${parallel[@]}" --repeats "${REPEATS:-5}" \
        --rate 27.275639319603314 --num-requests ${LENGTHS:-10000 20000} \
        --output results/events_cost.json 2>&1 | tee results/events_cost.log
fi
left=$((BUDGET - (SECONDS - start) - 5))
date -u +"events_cost done %T; $left s left for the probe's arm"
if [ "$left" -gt 10 ]; then
    timeout "$left" "$PY" benchmarks/events_cost.py --probe --repeats "${PROBE_REPEATS:-3}" \
        --rate 27.275639319603314 --num-requests "${PROBE_LENGTH:-5000}" \
        --output results/events_probe.json 2>&1 | tee results/events_probe.log
fi
date -u +"view_slot end %T"
