"""Policies on a reasoning mix in the simulator: does a phase-aware policy protect short answers?

Workload: thinking-mix (heddle/workloads/thinking.py: 60% chat without thinking, 25% short
problems thinking ~1.1K tokens, 15% competition math thinking ~12K tokens; lengths sourced
there), Poisson arrivals at `--load` times the capacity. Capacity is measured first: fcfs
under arrivals far above it (20 requests/s), its output tokens per second while the queue is
full (between 20% and 80% of the arrival span), divided by the workload's mean output length. Policies: fcfs, mlfq,
mlfq with `phase_aware` (a request is promoted once when its answer starts),
sjf with `repredict` (remaining length re-predicted from phase and tokens generated).

Reported per policy: p50 / p99 TTFT of the chat requests (the short answers), p99 time to the
first answer token of the thinking requests, output tokens per second over the run, relative to
fcfs. Simulated H100, Llama-3.1-8B roofline, budget 8192 tokens, 256 seats.

    .venv/bin/python benchmarks/reasoning_policies.py                   # a few minutes
    .venv/bin/python benchmarks/reasoning_policies.py --requests 1000 --seeds 0,1,2

Writes results/reasoning_policies.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import EngineConfig, SchedulerConfig
from heddle.core.policies import make_policy
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.sim import RooflineCostModel, SimulatedExecutor, kv_cache_blocks, load_model_spec
from heddle.sim.simulator import SIM_EOS_TOKEN_ID
from heddle.workloads import get_workload

MODEL, HARDWARE, BUDGET, SEATS, BLOCK = "llama-3.1-8b", "h100", 8192, 256, 16
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "fcfs": ("fcfs", {}),
    "mlfq": ("mlfq", {}),
    "mlfq-phase": ("mlfq", {"phase_aware": True}),
    "sjf-repredict": ("sjf", {"repredict": True}),
}


def simulate(policy: str, seed: int, num_requests: int, rate: float) -> dict[str, Any]:
    model = load_model_spec(MODEL)
    cost = RooflineCostModel(model, HARDWARE, tp=model.default_tp)
    num_blocks = kv_cache_blocks(model, HARDWARE, BLOCK, tp=model.default_tp,
                                 max_num_batched_tokens=BUDGET, max_num_seqs=SEATS)
    workload = get_workload("thinking-mix", seed=seed, num_requests=num_requests, rate=rate)
    thinking = {r.request_id: r.thinking_len for r in workload.requests}
    name, options = POLICIES[policy]
    clock = VirtualClock()
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET,
                                                    max_num_seqs=SEATS))
    engine = Engine(config, SimulatedExecutor(cost, clock, model.vocab_size),
                    num_blocks=num_blocks, clock=clock, eos_token_id=SIM_EOS_TOKEN_ID,
                    vocab_size=model.vocab_size, policy=make_policy(name, **options),
                    record_steps=False, final_outputs_only=True)
    result = replay(engine, workload, vocab_size=model.vocab_size)
    chat_ttft = []
    answer_ttft = []
    tokens = 0
    for record in result.records:
        tokens += record.num_output_tokens
        if record.request_class == "chat" and record.ttft is not None:
            chat_ttft.append(record.ttft)
        elif thinking.get(record.request_id):
            times = list(record.token_times)
            index = thinking[record.request_id]
            if index < len(times):
                answer_ttft.append(times[index] - record.arrival_time)
    return {
        "policy": policy, "seed": seed, "rate": rate, "elapsed": result.elapsed,
        "tokens_per_second": tokens / result.elapsed,
        "chat_ttft_p50": _quantile(chat_ttft, 0.5), "chat_ttft_p99": _quantile(chat_ttft, 0.99),
        "answer_ttft_p99": _quantile(answer_ttft, 0.99), "finished": len(result.records),
        "mean_output_len": statistics.mean(r.output_len for r in workload.requests),
        "saturated_tokens_per_second": _window_rate(result.records, workload.requests),
    }


def _window_rate(records: list[Any], requests: list[Any]) -> float:
    """Output tokens per second between 20% and 80% of the arrival span."""
    span = max(r.arrival_time for r in requests)
    lo, hi = 0.2 * span, 0.8 * span
    count = sum(1 for record in records for t in record.token_times if lo <= t < hi)
    return count / (hi - lo) if hi > lo else math.nan


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--load", type=float, default=1.5)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for seed in seeds:
        probe = simulate("fcfs", seed, args.requests, 20.0)
        capacity = probe["saturated_tokens_per_second"] / probe["mean_output_len"]
        rate = args.load * capacity
        print(f"seed {seed}: capacity {capacity:.2f} req/s, rate {rate:.2f} req/s", flush=True)
        for policy in POLICIES:
            rows.append({"capacity": capacity, **simulate(policy, seed, args.requests, rate)})
    print(f"\nsimulated {HARDWARE.upper()}, {MODEL} roofline, thinking-mix, {args.requests} "
          f"requests at {args.load}x capacity, seeds {seeds}; host "
          f"{platform.processor() or platform.machine()}")
    print("\n| policy | chat TTFT p50 (s) | chat TTFT p99 (s) | fcfs / policy (p99) | thinking "
          "requests' first answer token p99 (s) | output tok/s | vs fcfs |")
    print("|---|---|---|---|---|---|---|")
    med = statistics.median
    base = {k: med(r[k] for r in rows if r["policy"] == "fcfs")
            for k in ("chat_ttft_p99", "tokens_per_second")}
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        p99 = med(r["chat_ttft_p99"] for r in mine)
        tps = med(r["tokens_per_second"] for r in mine)
        print(f"| {policy} | {med(r['chat_ttft_p50'] for r in mine):.2f} | {p99:.2f} | "
              f"{base['chat_ttft_p99'] / p99:.1f}x | {med(r['answer_ttft_p99'] for r in mine):.1f}"
              f" | {tps:.0f} | {tps / base['tokens_per_second']:.3f} |")
    Path("results").mkdir(exist_ok=True)
    Path("results/reasoning_policies.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
