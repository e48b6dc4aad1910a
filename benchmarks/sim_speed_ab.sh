#!/usr/bin/env bash
# The issue-9 command, whole (/usr/bin/time -v), for this worktree and a baseline worktree,
# alternated, ROUNDS times each; and, with NUM=1000000 ROUNDS=1 BASE=, the 1M run alone.
# Usage (from the worktree, under the bench lock):
#   /work/tools/bench timeout 520 benchmarks/sim_speed_ab.sh                  # 100k vs BASE
#   NUM=1000000 ROUNDS=1 BASE= /work/tools/bench timeout 800 benchmarks/sim_speed_ab.sh
# BASE: a worktree of the baseline commit (git worktree add /tmp/core/base d90ed20).
# Raw output in results/sim_speed_ab/; RSS of each run sampled every 30 s beside it.
set -u
NUM=${NUM:-100000}; ROUNDS=${ROUNDS:-2}; BASE=${BASE-/tmp/core/base}
here=$(pwd); out=$here/results/sim_speed_ab; mkdir -p "$out"
/work/tools/py -c "from heddle.hostinfo import machine_line; print(machine_line())"
sides=new; [ -n "$BASE" ] && sides="new base"
for i in $(seq 1 "$ROUNDS"); do
  for side in $sides; do
    dir=$here; [ "$side" = base ] && dir=$BASE
    log=$out/${side}_${NUM}_$i.txt; date -u
    (cd "$dir" && exec /usr/bin/time -v /work/tools/py -m heddle simulate --workload chat \
      --rate 20 --num-requests "$NUM" --model llama-3.1-8b --hardware h100 --no-progress) \
      > "$log" 2>&1 &
    pid=$!; t0=$(date +%s)
    while kill -0 $pid 2>/dev/null; do
      child=$(pgrep -P $pid | head -1)
      [ -n "$child" ] && echo "$(( $(date +%s) - t0 )) s $(grep VmRSS /proc/$child/status 2>/dev/null)" >> "$log.rss"
      sleep 30
    done
    wait $pid
    grep -E "requests, |Elapsed|Maximum resident|User time" "$log" | sed "s/^/$side $i: /"
  done
done
