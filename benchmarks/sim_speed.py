"""Simulator speed: simulated requests per wall second, chat on Llama-3.1-8B / H100 roofline.

First measures the saturation throughput (all requests at once), then simulates
`--num-requests` chat requests arriving (Poisson) at `--load` x that throughput, and reports
requests simulated per wall second. The simulator runs the real Engine, Scheduler and KV cache
manager; only the executor and the clock are replaced.

    .venv/bin/python benchmarks/sim_speed.py --num-requests 100000 --load 0.8
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.metrics import summarize
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload


def run(num_requests: int, rate: float, seed: int, steps: bool) -> tuple[float, float, object]:
    config = EngineConfig(
        # The block hash `heddle simulate` uses (heddle/core/block_hash.py; same decisions).
        cache=CacheConfig(block_size=16, block_hash="builtin"),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
    )
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100", record_steps=steps)
    workload = get_workload("chat", seed=seed, num_requests=num_requests, rate=rate)
    result = simulate(workload, engine)
    return result.wall_seconds, result.elapsed, summarize(result.records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=100_000)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--saturation-requests", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/sim_speed.json")
    args = parser.parse_args()

    _, _, saturated = run(args.saturation_requests, math.inf, args.seed, steps=False)
    capacity = saturated.overall.request_throughput  # type: ignore[attr-defined]
    rate = args.load * capacity
    print(f"saturation throughput {capacity:.1f} req/s; simulating at {rate:.1f} req/s")
    wall, simulated, summary = run(args.num_requests, rate, args.seed, steps=False)
    speed = args.num_requests / wall
    o = summary.overall  # type: ignore[attr-defined]
    print(
        f"{args.num_requests} requests: {simulated:.0f} s simulated in {wall:.1f} s wall "
        f"= {speed:.0f} requests/s ({simulated / wall:.1f}x real time); "
        f"TTFT p50 {1000 * o.ttft.p50:.0f} ms, p99 {1000 * o.ttft.p99:.0f} ms; "
        f"TPOT p50 {1000 * o.tpot.p50:.1f} ms"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()} {platform.processor()}",
                "num_requests": args.num_requests,
                "load": args.load,
                "capacity_req_s": capacity,
                "rate": rate,
                "wall_seconds": wall,
                "simulated_seconds": simulated,
                "requests_per_wall_second": speed,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
