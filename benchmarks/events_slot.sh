#!/usr/bin/env bash
# The timed figure of docs/VIEW.md's decision-events row in one bench slot (about 10 minutes):
#   SLOT_END=05:26:30 /work/tools/bench bash benchmarks/events_slot.sh
# 1. benchmarks/events_cost.py --fresh: events on vs off on the simulator's hot path, one arm
#    at a time, each run in a fresh process, the order changing every pair (REPEATS pairs), at
#    each of LENGTHS chat requests;
# 2. in the time left, events_cost.py --parallel: each pair's two arms at the same moment, one
#    pinned to each CPU, swapped every pair (PARALLEL_REPEATS pairs).
# A run cut by the slot's end keeps its whole pairs: events_cost.py --from-log LOG.
# (The instruction counts beside it, `events_cost.py --instructions`, need no quiet machine.)
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/tools/py}
RATE=27.275639319603314  # chat at 80% of saturation on the Llama-3.1-8B/H100 roofline
if [ -n "${SLOT_END:-}" ]; then
    BUDGET=$(( $(date -u -d "$SLOT_END" +%s) - $(date -u +%s) ))
fi
BUDGET=${BUDGET:-560}
echo "budget ${BUDGET} s"
mkdir -p results
start=$SECONDS
date -u +"events_slot start %T"
left=$((BUDGET - ${PARALLEL_S:-150}))
timeout "$left" "$PY" benchmarks/events_cost.py --fresh --repeats "${REPEATS:-6}" --rate "$RATE" \
    --num-requests ${LENGTHS:-10000 20000} --output results/events_cost_fresh.json 2>&1 \
    | tee results/events_cost_fresh.log
left=$((BUDGET - (SECONDS - start) - 5))
date -u +"fresh done %T; $left s left for --parallel"
if [ "$left" -gt 20 ]; then
    timeout "$left" "$PY" benchmarks/events_cost.py --parallel --repeats "${PARALLEL_REPEATS:-5}" \
        --rate "$RATE" --num-requests ${LENGTHS:-10000 20000} \
        --output results/events_cost_parallel.json 2>&1 | tee results/events_cost_parallel.log
fi
date -u +"events_slot end %T"
