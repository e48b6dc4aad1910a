"""Policies on a reasoning mix in the simulator: does a phase-aware policy protect short answers?

Workload: thinking-mix (heddle/workloads/thinking.py: 60% chat without thinking, 25% short
problems thinking ~1.1K tokens, 15% competition math thinking ~12K tokens; lengths sourced
there), Poisson arrivals at `--load` times the capacity. Policies: fcfs, mlfq, mlfq with
`phase_aware` (thinking requests rank below answering ones; a request enters the top level
when its answer starts), sjf with `repredict` (remaining length re-predicted from the phase).
Simulated H100, Llama-3.1-8B roofline, budget 8192 tokens, `--seats` running requests.

Capacity is calibrated first, per seed: fcfs under Poisson arrivals far above capacity
(`--probe-rate`), its output tokens per second in the steady window (below), over the
workload's mean output length. (All requests queued at t=0 is not the same: the first
minutes of a saturated run decode short contexts in a KV pool not yet full, and a short probe
overstates capacity more than 2x; the previous version of this study ran at "1.5x" such a
capacity without ever queueing a chat request.) The load a run offers is then checked by
fcfs's TTFT trend, which in a queue that grows is load - 1 (seconds per second).

Measured the steady-state way (heddle/metrics/steady.py): over requests arriving between 20%
of the arrival span and the last arrival, TTFT censored at the end of the run, output tokens
per second inside that window. Reported per policy (mean over seeds, 95% t-interval, range):
p50 / p99 TTFT of the chat requests (the short answers), p99 time to the first answer token of
the thinking requests, output tokens/s, both relative to fcfs, at each run length (a verdict
that holds in a steady state does not move with the length).

Runs are split into pieces and kept in results/reasoning_policies/<name>.json (`--resume`
reuses what is there):

    python benchmarks/reasoning_policies.py run --seeds 0 --requests 2000   # one piece
    python benchmarks/reasoning_policies.py run --seeds 0,1,2 --requests 2000,4000 --resume
    python benchmarks/reasoning_policies.py report
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.metrics.steady import interval, window_report
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload

MODEL, HARDWARE, BUDGET, BLOCK = "llama-3.1-8b", "h100", 8192, 16
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "fcfs": ("fcfs", {}),
    "mlfq": ("mlfq", {}),
    "mlfq-phase": ("mlfq", {"phase_aware": True}),
    # The replay's max_tokens is each request's true length: the re-predictor must not read it.
    "sjf-repredict": ("sjf", {"repredict": True, "repredict_max_tokens": False}),
}


def run_sim(policy: str, seed: int, num_requests: int, rate: float, seats: int) -> Any:
    name, options = POLICIES[policy]
    workload = get_workload("thinking-mix", seed=seed, num_requests=num_requests, rate=rate)
    config = EngineConfig(
        cache=CacheConfig(block_size=BLOCK),
        scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=seats,
                                  policy=name, policy_options=options),
        seed=seed,
    )
    engine = build_sim_engine(config, model=MODEL, hardware=HARDWARE, record_steps=False)
    return workload, simulate(workload, engine)


def capacity(seed: int, num_requests: int, rate: float, seats: int) -> dict[str, float]:
    """Requests/s fcfs sustains with its queue never empty (see the module doc)."""
    workload, result = run_sim("fcfs", seed, num_requests, rate, seats)
    overall = window_report(result.records).overall
    mean_len = statistics.mean(r.output_len for r in workload.requests)
    return {"tokens_per_second": overall.output_throughput, "mean_output_len": mean_len,
            "requests_per_second": overall.output_throughput / mean_len,
            "probe_rate": rate, "probe_requests": num_requests,
            "probe_ttft_trend": overall.ttft_trend or math.nan}


def measure(policy: str, seed: int, num_requests: int, rate: float, seats: int) -> dict[str, Any]:
    started = time.perf_counter()
    workload, result = run_sim(policy, seed, num_requests, rate, seats)
    wall = time.perf_counter() - started
    report = window_report(result.records, classes=["chat"])
    chat, overall = report.classes["chat"], report.overall
    (lo, hi), = report.intervals
    thinking = {r.request_id: r.thinking_len for r in workload.requests if r.thinking_len}
    run_end = max(t for r in result.records for t in r.token_times[-1:])
    answer_waits = []
    for record in result.records:
        index = thinking.get(record.request_id)
        if index is None or not lo <= record.arrival_time < hi:
            continue
        times = record.token_times
        reached = times[index] if index < len(times) else run_end  # censored: not yet
        answer_waits.append(reached - record.arrival_time)
    return {
        "policy": policy, "seed": seed, "requests": num_requests, "rate": rate, "seats": seats,
        "wall_seconds": wall, "window": [lo, hi],
        "chat_ttft_p50": chat.ttft.p50, "chat_ttft_p99": chat.ttft.p99,
        "chat_ttft_trend": chat.ttft_trend, "ttft_trend": overall.ttft_trend,
        "answer_ttft_p99": _quantile(answer_waits, 0.99),
        "output_tokens_per_second": overall.output_throughput,
        "total_tokens_per_second": overall.total_token_throughput,
        "unfinished": overall.unfinished, "preemptions": result.num_preemptions,
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _path(name: str) -> Path:
    return Path("results/reasoning_policies") / f"{name}.json"


def _load(name: str) -> dict[str, Any]:
    path = _path(name)
    if path.exists():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return {"capacity": {}, "rows": []}


def _save(name: str, data: dict[str, Any]) -> None:
    path = _path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def run(args: argparse.Namespace) -> None:
    data = _load(args.name) if args.resume else {"capacity": {}, "rows": []}
    data["machine"] = platform.processor() or platform.machine()
    data["load"], data["seats"] = args.load, args.seats
    done = {(r["policy"], r["seed"], r["requests"]) for r in data["rows"]}
    for seed in args.seeds:
        key = str(seed)
        if key not in data["capacity"]:
            data["capacity"][key] = capacity(seed, args.probe_requests, args.probe_rate,
                                             args.seats)
            _save(args.name, data)
        cap = data["capacity"][key]
        rate = args.load * cap["requests_per_second"]
        print(f"seed {seed}: capacity {cap['requests_per_second']:.3f} req/s "
              f"({cap['tokens_per_second']:.0f} tok/s), rate {rate:.3f} req/s", flush=True)
        for num in args.requests:
            for policy in args.policies:
                if (policy, seed, num) in done:
                    continue
                row = measure(policy, seed, num, rate, args.seats)
                data["rows"].append(row)
                _save(args.name, data)
                print(f"  {policy} n={num}: chat TTFT p99 {row['chat_ttft_p99']:.1f} s, "
                      f"{row['output_tokens_per_second']:.0f} tok/s, trend "
                      f"{row['ttft_trend']:.3f} ({row['wall_seconds']:.0f} s wall)", flush=True)


def report(args: argparse.Namespace) -> None:
    data = _load(args.name)
    rows = data["rows"]
    seeds = sorted({r["seed"] for r in rows})
    caps = [data["capacity"][str(s)]["requests_per_second"] for s in seeds]
    print(f"simulated {HARDWARE.upper()}, {MODEL} roofline, thinking-mix, {data['seats']} seats, "
          f"budget {BUDGET}, load {data['load']}x capacity ({interval(caps).text('.3f')} req/s), "
          f"seeds {seeds}; host {data.get('machine')}")
    print("\n| requests | policy | chat TTFT p50 (s) | chat TTFT p99 (s) | fcfs / policy "
          "(chat p99) | first answer token p99 (s) | output tok/s | vs fcfs | fcfs TTFT "
          "trend |")
    print("|---|---|---|---|---|---|---|---|---|")
    for num in sorted({r["requests"] for r in rows}):
        by = {(r["policy"], r["seed"]): r for r in rows if r["requests"] == num}
        for policy in POLICIES:
            mine = [by[(policy, s)] for s in seeds if (policy, s) in by]
            base = [by[("fcfs", s)] for s in seeds if (policy, s) in by and ("fcfs", s) in by]
            if not mine or len(base) != len(mine):
                continue
            ratio = interval(b["chat_ttft_p99"] / m["chat_ttft_p99"] for b, m in zip(base, mine,
                                                                                     strict=True))
            tput = interval(m["output_tokens_per_second"] / b["output_tokens_per_second"]
                            for b, m in zip(base, mine, strict=True))
            trend = interval(b["ttft_trend"] for b in base)
            print(f"| {num} | {policy} | {interval(m['chat_ttft_p50'] for m in mine).text()} | "
                  f"{interval(m['chat_ttft_p99'] for m in mine).text()} | {ratio.text('.1f')} | "
                  f"{interval(m['answer_ttft_p99'] for m in mine).text('.0f')} | "
                  f"{interval(m['output_tokens_per_second'] for m in mine).text('.0f')} | "
                  f"{tput.text('.3f')} | {trend.text('.3f')} |")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="run pieces (policy x seed x length), kept in the JSON")
    r.add_argument("--seeds", type=_ints, default=[0])
    r.add_argument("--requests", type=_ints, default=[2000], help="run lengths (requests)")
    r.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    r.add_argument("--load", type=float, default=1.5)
    r.add_argument("--seats", type=int, default=64, help="max_num_seqs")
    r.add_argument("--probe-requests", type=int, default=1500,
                   help="requests of the capacity probe")
    r.add_argument("--probe-rate", type=float, default=3.0,
                   help="arrivals of the capacity probe (requests/s, far above capacity)")
    r.add_argument("--resume", action="store_true")
    for p in (r, sub.add_parser("report", help="the table of what the JSON holds")):
        p.add_argument("--name", default="study")
    args = parser.parse_args()
    if args.mode == "run":
        unknown = set(args.policies) - set(POLICIES)
        if unknown:
            parser.error(f"unknown policies {sorted(unknown)}: use {', '.join(POLICIES)}")
        run(args)
    report(args)


if __name__ == "__main__":
    main()
