#!/usr/bin/env bash
# One bench slot of the fidelity rerun (docs/BENCHMARKS.md section 4): the profile and the
# grid of one dtype back to back in one process (a profile from another slot is stale), then,
# if time is left, the shared-L3 test; each under a wall-clock limit so the slot ends by END.
#   [RESERVE_S=70] tools/bench benchmarks/fidelity_slot.sh DTYPE OUTDIR END(HH:MM:SS UTC) [CANARY] [RETIME]
# (RESERVE_S: seconds kept from the grid for the cache test; FIDELITY_ARGS: more flags of
#  sim_fidelity.py, e.g. "--rounds 2 --repeats 1")
set -u
dtype=${1:?dtype (auto or float32)}; out=${2:?output dir}; end=${3:?end time HH:MM:SS UTC}
canary=${4:-16}; retime=${5:-24}
py=${PY:-/work/tools/py}
end_s=$(date -u -d "$end" +%s)
mkdir -p "$out"
date -u +"start %H:%M:%S UTC"
head -1 /proc/stat  # user nice system idle iowait irq softirq steal (1/100 s)
grid_s=$(( end_s - $(date -u +%s) - ${RESERVE_S:-70} ))
timeout "$grid_s" "$py" -u benchmarks/sim_fidelity.py --num-requests 24 --runs 3 --dtype "$dtype" \
  --cases chat@2.5,long-prompt-mix@2.5,chat@1.0,long-prompt-mix@1.0 --canary "$canary" \
  --retime "$retime" ${FIDELITY_ARGS:-} --output "$out/sim_fidelity.json" 2>&1 | tee "$out/sim_fidelity.log"
date -u +"grid done %H:%M:%S UTC"
left=$(( end_s - $(date -u +%s) ))
if [ "$left" -ge 45 ]; then
  timeout "$left" "$py" -u benchmarks/shared_cache.py --dtypes "$dtype" --rounds 2 \
    --stream-mib 64,1024 --series 10 2>&1 | tee "$out/shared_cache.log"
fi
head -1 /proc/stat
date -u +"end %H:%M:%S UTC"
