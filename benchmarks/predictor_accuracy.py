"""How well is a request's remaining output predicted after it has generated 0, 64, 256 tokens?

The simulator runs the thinking-mix workload (heddle/workloads/thinking.py: chat requests
among requests that think first, lengths sourced there) through `sjf` with re-prediction
(`RemainingLenPredictor`: per class and phase, the mean residual life of the lengths seen so
far). At each checkpoint the prediction made then -- by a predictor that has learnt only from
requests that finished earlier -- is paired with the request's actual remaining length, and
the pairs' Kendall tau-b is reported, next to that of the arrival-time predictor
(`OutputLenPredictor`, whose remaining length is its one prediction minus the tokens
generated). Requests that arrive in the first `--warmup` share of the run are left out (the
predictor has seen too few finishes then).

    .venv/bin/python benchmarks/predictor_accuracy.py                    # ~1 min
    .venv/bin/python benchmarks/predictor_accuracy.py --seeds 0,1,2 --requests 4000

Writes results/predictor_accuracy.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import EngineConfig, SchedulerConfig
from heddle.core.policies.predictor import CHECKPOINTS, OutputLenPredictor
from heddle.core.policies.sjf import SJFPolicy
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.metrics.rank import kendall_tau_b
from heddle.request import Request
from heddle.sim import RooflineCostModel, SimulatedExecutor, kv_cache_blocks, load_model_spec
from heddle.sim.simulator import SIM_EOS_TOKEN_ID
from heddle.workloads import get_workload

MODEL, HARDWARE, BUDGET, SEATS, BLOCK = "llama-3.1-8b", "h100", 8192, 256, 16


class RecordingSJF(SJFPolicy):
    """sjf with re-prediction that also records the arrival-time predictor's guess at each
    checkpoint (the baseline), at the same moments."""

    def __init__(self) -> None:
        # The replay sets max_tokens to each request's true length: the bound would be the
        # answer, so the re-predictor is measured without it.
        super().__init__(repredict=True, default_output_len=128.0, repredict_max_tokens=False)
        self.baseline = OutputLenPredictor(default_output_len=128.0)
        self._baseline_at: dict[str, dict[int, tuple[float, int]]] = {}
        self.baseline_pairs: dict[int, list[tuple[float, int, str]]] = {
            c: [] for c in CHECKPOINTS
        }

    def predicted_output_len(self, request: Request) -> float:
        predicted = super().predicted_output_len(request)
        generated = request.num_output_tokens
        seen = self._baseline_at.setdefault(request.request_id, {})
        for checkpoint in CHECKPOINTS:
            if checkpoint <= generated < checkpoint + 16 and checkpoint not in seen:
                total = self.baseline.predict(request)
                seen[checkpoint] = (max(1.0, total - generated), generated)
        return predicted

    def on_finished(self, request: Request) -> None:
        super().on_finished(request)
        self.baseline.observe(request)
        for checkpoint, (guess, generated) in self._baseline_at.pop(request.request_id, {}).items():
            actual = request.num_output_tokens - generated
            self.baseline_pairs[checkpoint].append((guess, actual, request.request_id))


def run(seed: int, num_requests: int, rate: float, warmup: float) -> dict[str, Any]:
    model = load_model_spec(MODEL)
    cost = RooflineCostModel(model, HARDWARE, tp=model.default_tp)
    num_blocks = kv_cache_blocks(model, HARDWARE, BLOCK, tp=model.default_tp,
                                 max_num_batched_tokens=BUDGET, max_num_seqs=SEATS)
    workload = get_workload("thinking-mix", seed=seed, num_requests=num_requests, rate=rate)
    first_kept = workload.requests[int(warmup * len(workload.requests))].arrival_time
    kept = {r.request_id for r in workload.requests if r.arrival_time >= first_kept}
    clock = VirtualClock()
    policy = RecordingSJF()
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET,
                                                    max_num_seqs=SEATS))
    engine = Engine(config, SimulatedExecutor(cost, clock, model.vocab_size), num_blocks=num_blocks,
                    clock=clock, eos_token_id=SIM_EOS_TOKEN_ID, vocab_size=model.vocab_size,
                    policy=policy, record_steps=False, final_outputs_only=True)
    wall = time.perf_counter()
    result = replay(engine, workload, vocab_size=model.vocab_size)
    wall = time.perf_counter() - wall
    remaining = policy.remaining
    assert remaining is not None
    out: dict[str, Any] = {"seed": seed, "requests": num_requests, "rate": rate,
                           "virtual_seconds": result.elapsed, "wall_seconds": wall,
                           "checkpoints": {}}
    for checkpoint in CHECKPOINTS:
        pairs = [p for p in remaining.accuracy[checkpoint] if p[2] in kept]
        base = [p for p in policy.baseline_pairs[checkpoint] if p[2] in kept]
        out["checkpoints"][checkpoint] = {
            "n": len(pairs),
            "tau_repredict": kendall_tau_b([p[0] for p in pairs], [p[1] for p in pairs]),
            "tau_arrival": kendall_tau_b([p[0] for p in base], [p[1] for p in base]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=3.0, help="requests per second")
    parser.add_argument("--warmup", type=float, default=0.1)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [run(seed, args.requests, args.rate, args.warmup) for seed in seeds]
    print(f"simulated {HARDWARE.upper()}, {MODEL} roofline, sjf(repredict), thinking-mix, "
          f"{args.requests} requests at {args.rate} req/s, seeds {seeds}; host "
          f"{platform.processor() or platform.machine()}")
    print("\n| generated tokens | requests (median) | tau, re-predicted | tau, arrival-time |")
    print("|---|---|---|---|")
    for checkpoint in CHECKPOINTS:
        rows = [r["checkpoints"][checkpoint] for r in runs]
        med = statistics.median
        print(f"| {checkpoint} | {med(r['n'] for r in rows):.0f} | "
              f"{med(r['tau_repredict'] for r in rows):.3f} "
              f"({min(r['tau_repredict'] for r in rows):.3f}-"
              f"{max(r['tau_repredict'] for r in rows):.3f}) | "
              f"{med(r['tau_arrival'] for r in rows):.3f} |")
    Path("results").mkdir(exist_ok=True)
    Path("results/predictor_accuracy.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
