#!/usr/bin/env bash
# The steady-state runs of docs/POLICIES.md "Steady state and overload", split into CPU jobs of
# under ~5 minutes each (the dev box is shared by several engineers): every piece is one
# benchmarks/steady_state.py command with --resume (each finished point is saved at once), so
# a piece cut short by its timeout loses only the points in flight; rerun the group to finish.
# `python benchmarks/steady_state.py table results/steady_state/<name>*.json --by ...` merges.
#   benchmarks/steady_state_runs.sh study        # slo + priority rows, reasoning, multi-tenant
#   benchmarks/steady_state_runs.sh throughput N SEEDS   # target 1 (runs cut at the last arrival)
#   benchmarks/steady_state_runs.sh horizon      # one case against the run's length
#   BG=1 /work/tools/bg LOG benchmarks/steady_state_runs.sh long   # reasoning, multi-tenant 10k-30k
#   benchmarks/steady_state_runs.sh burst        # bursts apart from sustained overload
#   benchmarks/steady_state_runs.sh slack        # target 3: the shedder's slack and the tail
#   BG=1 /work/tools/bg LOG benchmarks/steady_state_runs.sh target2   # fcfs + shedder, 3k-30k
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/work/tools/py}
CPU=${CPU:-/work/tools/cpu}
# The timeout runs inside the CPU lock: time spent waiting for a timed benchmark to end is not
# the job's. A piece that runs past it loses only the points in flight (--resume keeps the rest).
# BG=1: run under /work/tools/bg instead (niced, paused during timed benchmarks, no timeout:
# paused time would count), one process per point.
if [ "${BG:-0}" = 1 ]; then
  piece() { echo "$(date -u +%H:%M:%S) $*"; "$PY" benchmarks/steady_state.py "$@" --resume --jobs 1 >/dev/null; }
else
  piece() { "$CPU" timeout 290 "$PY" benchmarks/steady_state.py "$@" --resume --jobs 2 >/dev/null; }
fi
case "${1:-}" in
  study)
    # chat and multi-tenant have one priority (priority = fcfs there); fair only matters with
    # several users (multi-tenant).
    for wp in long-prompt:fcfs,mlfq,lanes,slo,priority chat:fcfs,mlfq,lanes,slo \
              reasoning:fcfs,mlfq,lanes,slo,priority multi-tenant:fcfs,mlfq,lanes,slo,fair; do
      w=${wp%%:*}
      for p in ${wp#*:}; do
        p=${p//,/ }
        for q in $p; do
          piece study --workloads "$w" --policies "$q" --variants shed --num-requests 3000 \
            --seeds 0,1,2 --name "study_${w}_${q}"
        done
      done
    done ;;
  throughput)
    # One point (workload, load, policy, seeds) per piece and per file: a 30,000-request run
    # at 1.5x takes ~40 CPU-seconds alone and several minutes on a shared box, so a piece of two
    # points could not finish inside its timeout. Merge: table results/steady_state/tp_*_N_*.json
    n=${2:-10000}; seeds=${3:-0}
    for load in ${LOADS:-3 1.5}; do
      for w in ${WORKLOADS:-long-prompt chat multi-tenant reasoning}; do
        for p in ${POLICIES:-fcfs mlfq slo priority sjf oracle lanes fair adaptive plas}; do
          piece throughput --workloads "$w" --loads "$load" --policies "$p" --seeds "$seeds" \
            --num-requests "$n" --name "tp_${w}_${load}_${n}_${p}"
        done
      done
    done ;;
  horizon)
    # One case against the run's length (docs/POLICIES.md): long-prompt at 1.5x, fcfs without
    # and with the shedder, lanes with it; seeds 0-2 up to 3,000 requests (3,000: the study's
    # rows), seed 0 beyond. Merge with `table ... --by num_requests --load 1.5`.
    h() { piece horizon --workload long-prompt --load 1.5 "$@"; }
    h --horizons 1000,3000 --policies fcfs --variants default --seeds 0,1,2 \
      --name horizon_fcfs_default
    h --horizons 10000 --policies fcfs --variants default --seeds 0 --name horizon10k_fcfs_default
    for p in fcfs lanes; do
      h --horizons 1000 --policies $p --variants shed --seeds 0,1,2 --name "horizon1k_$p"
      h --horizons 10000 --policies $p --variants shed --seeds 0 --name "horizon10k_$p"
      h --horizons 30000 --policies $p --variants shed --seeds 0 --name "horizon30k_$p"
    done
    # ~62 CPU-s alone (fcfs + shedder): longer than a 5-minute job on a loaded shared box.
    h --horizons 100000 --policies fcfs --variants shed --seeds 0 --name horizon100k_fcfs ;;
  long)
    # The study rows of the policies docs/POLICIES.md names best against the run's length
    # (reasoning: priority; multi-tenant: fair), beside fcfs, with the shedder: 3,000 requests
    # (seeds 0-2), 10,000 and 30,000 (seed 0). Meant for BG=1 (minutes of CPU in all).
    for wp in reasoning:fcfs,priority multi-tenant:fcfs,fair; do
      w=${wp%%:*}
      for q in ${wp#*:}; do
        q=${q//,/ }
        for p in $q; do
          piece study --workloads "$w" --policies "$p" --variants shed --loads 1,1.5,3 \
            --num-requests 3000 --seeds 0,1,2 --name "study_${w}_${p}"
          for n in 10000 30000; do
            piece study --workloads "$w" --policies "$p" --variants shed --loads 1.5,3 \
              --num-requests $n --seeds 0 --name "study_${w}_${p}_${n}"
          done
        done
      done
    done ;;
  burst)
    for p in fcfs lanes mlfq; do
      piece burst --workload long-prompt --policies "$p" --variants default,shed \
        --num-requests 10000 --seeds 0,1,2 --name "burst_${p}"
    done ;;
  slack)
    # Target 3: the shedder's slack, not the order, sets the admitted requests' tail.
    for w in long-prompt chat; do
      for p in fcfs lanes mlfq; do
        piece study --workloads "$w" --policies "$p" --variants shed-0.3 --loads 3 \
          --num-requests 3000 --seeds 0,1,2 --name "slack_${w}_${p}"
      done
    done ;;
  target2)
    # Target 2 for fcfs with the shedder's room for the classes behind (heddle/core/admission.py):
    # every workload at 1x and 3x over 30,000 requests, reasoning also at 3,000 (3 seeds) and
    # 10,000, and priority on reasoning (target 3) at 30,000. Two streams, one process each.
    a() {
      piece study --workloads reasoning --policies fcfs --variants shed --loads 1,1.5,3 \
        --num-requests 3000 --seeds 0,1,2 --name shed2_reasoning_fcfs
      piece study --workloads reasoning --policies fcfs --variants shed --loads 1.5,3 \
        --num-requests 10000 --seeds 0 --name shed2_reasoning_fcfs_10000
      piece study --workloads reasoning --policies fcfs --variants shed --loads 1,3,1.5 \
        --num-requests 30000 --seeds 0 --name shed2_reasoning_fcfs_30000
      piece study --workloads reasoning --policies priority --variants shed --loads 3,1.5 \
        --num-requests 30000 --seeds 0 --name shed2_reasoning_priority_30000
    }
    b() {
      piece study --workloads long-prompt --policies fcfs --variants shed --loads 1,3 \
        --num-requests 30000 --seeds 0 --name shed2_long-prompt_fcfs_30000
      piece study --workloads long-prompt --policies fcfs --variants shed --loads 1,1.5,3 \
        --num-requests 3000 --seeds 0,1,2 --name shed2_long-prompt_fcfs
      for w in chat multi-tenant; do
        piece study --workloads $w --policies fcfs --variants shed --loads 1,3 \
          --num-requests 30000 --seeds 0 --name shed2_${w}_fcfs_30000
      done
    }
    a & b & wait ;;
  *) echo "usage: $0 study|throughput [N SEEDS]|horizon|long|burst|slack|target2" >&2; exit 2 ;;
esac
