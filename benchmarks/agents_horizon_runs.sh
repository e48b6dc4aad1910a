#!/usr/bin/env bash
# The SWE-like horizon runs of docs/AGENTS.md ("SWE-like against the run's length"): one
# benchmarks/agents_sessions.py sim point per line of JOBS (load, programs, seed, config and,
# optionally, one workload option KEY=VALUE such as tool_sigma_scale=1.5), two at
# a time, one JSON per point in OUT, resumable (a point whose JSON exists is skipped; a point is
# claimed by mkdir, so two workers never run the same one). A virtual clock: run it niced in the
# background (tools/bg), then `python benchmarks/agents_sessions.py horizon OUT/*.json ...`.
#   bash benchmarks/agents_horizon_runs.sh [OUT] [JOBS]
set -u
cd "$(dirname "$0")/.."
OUT=${1:-results/swe-horizon}
JOBS=${2:-$OUT/jobs.txt}
PY=${PY:-python}
mkdir -p "$OUT"
if [ ! -e "$JOBS" ]; then  # the doc's points: the first 18 in the order they ran, then the
  # later ones (LRU at 0.32-0.35 and in 0.01 steps over 0.29-0.34, the pin at 0.32-0.35)
  cat > "$JOBS" <<'LIST'
0.32 1080 1 fcfs:cost+tier
0.32 1080 2 fcfs:cost+tier
0.35 1080 1 fcfs:cost+tier
0.35 1080 2 fcfs:cost+tier
0.35 360 1 plas:cost+tier
0.35 360 2 plas:cost+tier
0.32 1080 1 fcfs:lru
0.32 1080 1 fcfs:ttl
0.38 1080 1 fcfs:cost+tier
0.38 1080 2 fcfs:cost+tier
0.28 1080 1 fcfs:lru
0.28 1080 2 fcfs:lru
0.28 1080 1 fcfs:cost+tier
0.28 1080 2 fcfs:cost+tier
0.35 1080 2 fcfs:ttl
0.35 1080 1 fcfs:lru
0.32 1080 0 fcfs:cost+tier
0.32 1080 2 fcfs:ttl
0.32 1080 2 fcfs:lru
0.35 1080 2 fcfs:lru
0.35 1080 1 fcfs:ttl
0.30 1080 1 fcfs:lru
0.30 1080 2 fcfs:lru
0.34 1080 1 fcfs:lru
0.34 1080 2 fcfs:lru
0.29 1080 1 fcfs:lru
0.29 1080 2 fcfs:lru
0.31 1080 1 fcfs:lru
0.31 1080 2 fcfs:lru
0.33 1080 1 fcfs:lru
0.33 1080 2 fcfs:lru
0.30 1080 1 fcfs:cost+tier
0.30 1080 2 fcfs:cost+tier
LIST
fi
worker() {
  while read -r L N S C O; do
    [ -z "$L" ] && continue
    tag="_${L}-n${N}-s${S}-${C/:/-}${O:+-${O//=/}}"
    opt=()
    [ -n "$O" ] && opt=(--workload-option "$O")
    [ -e "$OUT/agents-sim${tag}.json" ] && continue
    mkdir "$OUT/claim${tag}" 2>/dev/null || continue
    echo "$(date -u +%T) start $tag"
    $PY benchmarks/agents_sessions.py sim --workloads agent-swe --loads "$L" --num-programs "$N" \
      --seeds "$S" --configs "$C" --offload-blocks 32000 "${opt[@]}" --output-dir "$OUT" \
      --tag "$tag" \
      > "$OUT/out${tag}.txt" 2>&1
    echo "$(date -u +%T) done $tag rc=$?"
    rmdir "$OUT/claim${tag}"
  done < "$JOBS"
}
worker > "$OUT/w1.log" 2>&1 &
sleep 2
worker > "$OUT/w2.log" 2>&1 &
wait
