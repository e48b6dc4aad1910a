"""Per-step cost under overload: does a step cost more when more requests wait?

For each policy and waiting-queue size N: a simulated engine (Llama-3.1-8B on the H100
roofline, 64 seats, token budget 8192) gets 64 + N requests at once (64-token prompts, outputs
long enough that nobody finishes during the run). Once the 64 seats are taken and every seated
request decodes, --steps steps are timed on the wall clock: N requests wait through all of
them. A policy whose order keys never change keeps its queues ordered, so its step should not
grow with N; policies that re-rank by time (aging, deadlines, counters) may.

    /work/tools/bench /work/tools/py benchmarks/sim_overload.py
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.hostinfo import machine_line
from heddle.request import SamplingParams
from heddle.sim import RooflineCostModel, SimulatedExecutor

SEATS = 64


def step_cost(policy: str, num_waiting: int, steps: int, seed: int) -> float:
    """Median over 3 rounds of the wall seconds per step, `num_waiting` requests waiting."""
    clock = VirtualClock()
    cost = RooflineCostModel("llama-3.1-8b", "h100")
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=SEATS, policy=policy),
    )
    engine = Engine(
        config,
        SimulatedExecutor(cost, clock, vocab_size=32000),
        num_blocks=(SEATS + num_waiting) * 8 + 64,
        clock=clock,
        eos_token_id=2,
        record_steps=False,
        final_outputs_only=True,
    )
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    for i in range(SEATS + num_waiting):
        prompt = [rng.randrange(100, 32000) for _ in range(64)]
        engine.add_request(f"r{i}", prompt, params, user=f"u{i % 7}", priority=i % 3)
    scheduler = engine.scheduler
    for _ in range(10_000):  # until the seats are full and every seated request decodes
        engine.step()
        if len(scheduler.running) == SEATS and all(
            r.num_computed_tokens >= r.num_prompt_tokens for r in scheduler.running
        ):
            break
    rounds = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        rounds.append((time.perf_counter() - start) / steps)
    return sorted(rounds)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fcfs,priority,static,adaptive,lanes,sjf,mlfq,slo,fair")
    parser.add_argument("--waiting", default="100,1000,10000")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/sim_overload.json")
    args = parser.parse_args()

    sizes = [int(n) for n in args.waiting.split(",")]
    print(f"machine: {machine_line()}; {SEATS} seats, decode steps")
    print(f"{'policy':>10} " + " ".join(f"{f'{n} waiting':>14}" for n in sizes) + "   (us/step)")
    table: dict[str, dict[int, float]] = {}
    for policy in args.policies.split(","):
        table[policy] = {n: step_cost(policy, n, args.steps, args.seed) for n in sizes}
        print(f"{policy:>10} " + " ".join(f"{1e6 * table[policy][n]:14.0f}" for n in sizes))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"machine": machine_line(), "seats": SEATS, "us_per_step": table}, indent=1))


if __name__ == "__main__":
    main()
