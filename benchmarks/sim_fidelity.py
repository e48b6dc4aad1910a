"""Simulator fidelity: the real CPU engine vs the simulator on the same requests.

1. Profile the real ModelExecutor as `heddle profile` does (the grid's corners plus random
   steps like a running engine's, warm-up and repeats) and fit a `profiled` cost model; print
   its self-check (error on held-out shapes, per kind of step).
2. For each workload and load, `--runs` times: replay the requests on the real engine in real
   time (wall clock), logging every step's shape and duration; simulate the same requests
   (same arrival times, lengths, seeds) with the same Engine/Scheduler code on a virtual clock
   with the fitted cost model.
3. Report predicted vs measured p50/p90/p99 TTFT, TPOT, E2E and output throughput (relative
   error, median over the runs), and the cost model's per-step error on the steps the real
   engine ran (per kind of step). `--retime N` also re-times N real step shapes in isolation,
   as the profiler does: how far that is from the real step says what the profiler's setting
   misses (as opposed to what the model's form misses).

Run it on a quiet machine (the profile and the real runs must see the same machine):

    .venv/bin/python benchmarks/sim_fidelity.py --num-requests 30 --runs 3 --rates 1.0,2.5
    .venv/bin/python benchmarks/sim_fidelity.py ... --dtype float32

The real runs' steps are saved beside --output (`.steps.json`): `heddle profile --from-run`
fits a model to them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from heddle.clock import WallClock
from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.engine.replay import replay
from heddle.metrics import summarize
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import profile_executor, profile_model
from heddle.model.step_log import StepRecorder, save_steps
from heddle.sim.cost_model import StepShape
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

    def __init__(self, samples: list[tuple[StepShape, float]]) -> None:
        self.times = {_key(s): t for s, t in samples}

    def step_time(self, shape: StepShape) -> float:
        return self.times[_key(shape)]


def _key(shape: StepShape) -> tuple[object, ...]:
    return (shape.prefill_chunks, shape.num_decode_tokens, shape.decode_context_tokens,
            shape.num_sampled_rows)  # fmt: skip


def retime(executor: Any, steps: list[tuple[StepShape, float]], count: int, vocab: int) -> None:
    chosen = steps[:: max(1, len(steps) // count)][:count]
    timed = profile_executor(
        executor.execute, [s for s, _ in chosen], executor.block_size, repeats=3,
        num_blocks=executor.num_blocks, vocab_size=vocab,
    )  # fmt: skip
    print("re-timed in isolation vs the real steps:")
    print("\n".join(step_errors(_Lookup(timed), chosen).lines()))  # type: ignore[arg-type]


def run_pair(
    config: EngineConfig, executor: Any, cost: Any, workload: Any
) -> tuple[dict[str, dict[str, float]], list[tuple[StepShape, float]], float]:
    vocab = executor.model_shape.vocab_size
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
    sim = build_sim_engine(
        config,
        model=executor.model_shape,
        cost_model=cost,
        num_blocks=executor.num_blocks,
        max_model_len=executor.max_model_len,
    )
    sim_run = simulate(workload, sim)
    rows = compare(summarize(real_run.records), summarize(sim_run.records))
    return rows, recorder.steps, real_run.elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--rates", default="1.0,2.5", help="two loads, requests/s")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each profiled shape")
    parser.add_argument("--num-mixed", type=int, default=96, help="mixed steps profiled")
    parser.add_argument("--runs", type=int, default=3, help="real + simulated runs of each case")
    parser.add_argument("--output", default="results/sim_fidelity.json")
    parser.add_argument(
        "--retime", type=int, default=0,
        help="re-time this many of each case's real step shapes in isolation (diagnosis)",
    )  # fmt: skip
    args = parser.parse_args()

    config = engine_config(args)
    executor = ModelExecutor(config.model, config.cache)
    vocab = executor.model_shape.vocab_size
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}"
    started = time.perf_counter()
    cost = profile_model(
        executor,
        max_num_batched_tokens=args.budget,
        max_num_seqs=args.max_num_seqs,
        max_context=1024,
        num_mixed=args.num_mixed,
        repeats=args.repeats,
        seed=args.seed,
        machine=machine,
    )
    fit = cost.metadata.fit
    print(f"profiled {cost.metadata.extra['num_shapes']} shapes in "
          f"{time.perf_counter() - started:.0f} s ({executor.dtype})")  # fmt: skip
    if fit is not None:
        print("\n".join(fit.lines()))

    results: dict[str, Any] = {
        "machine": machine,
        "dtype": str(executor.dtype),
        "num_requests": args.num_requests,
        "runs_per_case": args.runs,
        "profile": cost.coefficients,
        "profile_fit": None if fit is None else fit.lines(),
        "cases": [],
    }
    all_steps: list[tuple[StepShape, float]] = []
    for name, options in WORKLOADS.items():
        for rate in (float(r) for r in args.rates.split(",")):
            workload = get_workload(
                name, seed=args.seed, num_requests=args.num_requests, rate=rate, **options
            )
            runs, steps = [], []
            for _ in range(args.runs):
                rows, run_steps, elapsed = run_pair(config, executor, cost, workload)
                runs.append(rows)
                steps.extend(run_steps)
                print(f"{name} @ {rate}: real run {elapsed:.1f} s, {len(run_steps)} steps")
            median = {m: statistics.median(r[m]["rel_error"] for r in runs) for m in runs[0]}
            per_step = step_errors(cost, steps)
            all_steps.extend(steps)
            results["cases"].append(
                {
                    "workload": name,
                    "rate": rate,
                    "options": options,
                    "runs": runs,
                    "median_rel_error": median,
                    "step_error": {
                        b.name: [b.num_steps, b.median_abs, b.p90_abs, b.median_signed]
                        for b in [per_step.overall, *per_step.buckets]
                    },
                }
            )
            print(f"\n{name} @ {rate} req/s, {args.runs} runs of {args.num_requests} requests")
            print(f"{'metric':14s} {'measured':>10s} {'simulated':>10s} {'median error':>13s}")
            for metric in median:
                measured = statistics.median(r[metric]["measured"] for r in runs)
                predicted = runs[0][metric]["predicted"]
                print(f"{metric:14s} {measured:10.4f} {predicted:10.4f} "
                      f"{100 * median[metric]:12.1f}%")  # fmt: skip
            print("per-step error of the cost model on the real steps:")
            print("\n".join(per_step.lines()))
            if args.retime:
                retime(executor, steps, args.retime, vocab)
    overall = step_errors(cost, all_steps).overall
    results["step_error_all"] = [overall.num_steps, overall.median_abs, overall.p90_abs]
    print(f"\nall real steps: {overall.num_steps}, |error| median "
          f"{100 * overall.median_abs:.1f}%, p90 {100 * overall.p90_abs:.1f}%")  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    steps_path = Path(args.output).with_suffix(".steps.json")
    save_steps(steps_path, all_steps, {"dtype": str(executor.dtype),
                                       "model": executor.model_name, "machine": machine})  # fmt: skip
    print(f"wrote {args.output} and {steps_path} ({len(all_steps)} real steps)")


if __name__ == "__main__":
    main()
