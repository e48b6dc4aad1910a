"""Simulator fidelity: the real CPU engine vs the simulator on the same requests, one run.

1. Profile the real ModelExecutor over a grid of step shapes and fit a `profiled` cost model.
2. For each workload and load: replay the requests on the real engine in real time (wall
   clock), then simulate the same requests (same arrival times, lengths, seeds) with the same
   Engine/Scheduler code on a virtual clock with the fitted cost model.
3. Report predicted vs measured p50/p90/p99 TTFT, TPOT, E2E and output throughput, with
   relative errors.

Run it on a quiet machine (nothing else using the cores): the profile and the real runs must see
the same machine.

    .venv/bin/python benchmarks/sim_fidelity.py --num-requests 60
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from heddle.clock import WallClock
from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.metrics import summarize
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import profile_executor, profile_grid
from heddle.model.step_log import StepRecorder, save_steps
from heddle.sim.profiled import fit_profile
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.sim.step_error import step_errors
from heddle.workloads import get_workload

# (workload, generator options) scaled so a 2-core CPU serves them in tens of seconds.
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": {"length_scale": 0.25},
    "long-prompt-mix": {"length_scale": 0.2, "long_share": 0.1},
}
METRICS = ("ttft", "tpot", "e2e")
QUANTILES = ("p50", "p90", "p99")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(dtype=args.dtype),
        cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.budget, max_num_seqs=args.max_num_seqs
        ),
    )


def compare(real: Any, sim: Any) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        for q in QUANTILES:
            measured = getattr(getattr(real.overall, metric), q)
            predicted = getattr(getattr(sim.overall, metric), q)
            rows[f"{metric} {q}"] = _row(measured, predicted)
    rows["output tok/s"] = _row(real.overall.output_throughput, sim.overall.output_throughput)
    return rows


def _row(measured: float, predicted: float) -> dict[str, float]:
    error = (predicted - measured) / measured if measured else float("nan")
    return {"measured": measured, "predicted": predicted, "rel_error": error}


class _Lookup:
    """A 'cost model' that answers the times measured for exactly these shapes."""

    def __init__(self, samples: list[tuple[Any, float]]) -> None:
        self.times = dict(samples)

    def step_time(self, shape: Any) -> float:
        return self.times[shape]


def retime(executor: Any, steps: list[tuple[Any, float]], count: int, vocab: int) -> None:
    """Time `count` of the real steps' shapes again, in isolation as the profiler does: how
    far the isolated time is from the real step's says what the profiler's setting misses."""
    chosen = steps[:: max(1, len(steps) // count)][:count]
    timed = profile_executor(
        executor.execute, [s for s, _ in chosen], executor.block_size, repeats=3,
        num_blocks=executor.num_blocks, vocab_size=vocab,
    )
    print("re-timed in isolation vs the real steps:")
    print("\n".join(step_errors(_Lookup(timed), chosen).lines()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=60)
    parser.add_argument("--rates", default="1.0,3.0", help="two loads, requests/s")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="results/sim_fidelity.json")
    parser.add_argument(
        "--retime", type=int, default=0,
        help="re-time this many of each run's real step shapes in isolation (diagnosis)",
    )
    args = parser.parse_args()

    config = engine_config(args)
    executor = ModelExecutor(config.model, config.cache)
    vocab = executor.model_shape.vocab_size
    started = time.perf_counter()
    shapes = profile_grid(
        max_num_batched_tokens=args.budget,
        max_num_seqs=args.max_num_seqs,
        max_context=1024,
        max_kv_tokens=executor.num_blocks * executor.block_size,
    )
    samples = profile_executor(
        executor.execute,
        shapes,
        executor.block_size,
        repeats=args.repeats,
        num_blocks=executor.num_blocks,
        vocab_size=vocab,
    )
    cost = fit_profile(
        samples, model=executor.model_name, dtype=str(executor.dtype), machine=platform.machine()
    )
    fit = cost.metadata.fit
    print(
        f"profiled {len(shapes)} shapes in {time.perf_counter() - started:.0f} s; "
        f"fit median |error| {100 * fit.median_abs_relative_error:.1f}%"
        if fit
        else ""
    )

    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "dtype": str(executor.dtype),
        "num_requests": args.num_requests,
        "profile": cost.coefficients,
        "runs": [],
    }
    all_steps: list[tuple[Any, float]] = []
    for name, options in WORKLOADS.items():
        for rate in (float(r) for r in args.rates.split(",")):
            workload = get_workload(
                name, seed=args.seed, num_requests=args.num_requests, rate=rate, **options
            )
            recorder = StepRecorder(executor)
            engine = Engine(
                config,
                recorder,
                num_blocks=executor.num_blocks,
                clock=WallClock(),
                eos_token_id=executor.eos_token_id,
                max_model_len=executor.max_model_len,
                vocab_size=vocab,
            )
            real_run = replay(engine, workload, vocab_size=vocab)
            sim_engine = build_sim_engine(
                config,
                model=executor.model_shape,
                cost_model=cost,
                num_blocks=executor.num_blocks,
                max_model_len=executor.max_model_len,
            )
            sim_run = simulate(workload, sim_engine)
            rows = compare(summarize(real_run.records), summarize(sim_run.records))
            per_step = step_errors(cost, recorder.steps)
            results["runs"].append(
                {
                    "workload": name,
                    "rate": rate,
                    "options": options,
                    "rows": rows,
                    "step_error": {
                        b.name: [b.num_steps, b.median_abs, b.p90_abs, b.median_signed]
                        for b in [per_step.overall, *per_step.buckets]
                    },
                }
            )
            all_steps.extend(recorder.steps)
            print("\n".join(per_step.lines()))
            if args.retime:
                retime(executor, recorder.steps, args.retime, vocab)
            print(
                f"\n{name} @ {rate} req/s ({len(real_run.records)} requests, real {real_run.elapsed:.1f} s)"
            )
            print(f"{'metric':14s} {'measured':>10s} {'simulated':>10s} {'error':>8s}")
            for metric, row in rows.items():
                print(
                    f"{metric:14s} {row['measured']:10.4f} {row['predicted']:10.4f} {100 * row['rel_error']:7.1f}%"
                )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    steps_path = Path(args.output).with_suffix(".steps.json")
    save_steps(steps_path, all_steps, {"dtype": str(executor.dtype), "model": executor.model_name})
    print(f"wrote {steps_path} ({len(all_steps)} real steps)")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
