"""Simulator fidelity: the real CPU engine vs the simulator on the same requests.

1. Profile the real ModelExecutor as `heddle profile` does (the grid's corners plus random
   steps like a running engine's, warm-up and repeats; then a few shapes back to back and
   after sleeps of 1 ms .. 1 s, the idle warm-up) and fit a `profiled` cost model; print its
   self-check (error on held-out shapes, per kind of step; the warm-up on held-out shapes).
2. For each workload and load, `--runs` times: replay the requests on the real engine in real
   time (wall clock), logging every step's shape and duration; simulate the same requests
   (same arrival times, lengths, seeds) with the same Engine/Scheduler code on a virtual clock
   with the fitted cost model, with its idle warm-up and without it (shape-only).
3. Report predicted vs measured p50/p90/p99 TTFT, TPOT, E2E and output throughput (relative
   error, median over the runs), and the cost model's per-step error on the steps the real
   engine ran (per kind of step). `--retime N` also re-times N real step shapes in isolation,
   as the profiler does: how far that is from the real step says what the profiler's setting
   misses (as opposed to what the model's form misses).
4. The idle-gap diagnosis: each real step's time over the back-to-back prediction for its
   shape, binned by the idle gap before it (decode-only and steps with prefill apart); each
   request's TTFT split into its wait before its first step and its first step(s), real vs
   simulated.

Run it on a quiet machine (the profile and the real runs must see the same machine):

    .venv/bin/python benchmarks/sim_fidelity.py --num-requests 30 --runs 3 --rates 1.0,2.5
    .venv/bin/python benchmarks/sim_fidelity.py ... --dtype float32

The real runs' steps are saved beside --output (`.steps.json`): `heddle profile --from-run`
fits a model to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
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
from heddle.errors import HeddleError
from heddle.hostinfo import machine_line
from heddle.metrics import summarize
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import (
    DECODE_RUNS,
    dispatch_rows,
    profile_executor,
    profile_model,
    profile_shapes,
)
from heddle.model.profiling_idle import fit_idle, idle_shapes, profile_idle
from heddle.model.step_log import StepRecorder, save_steps
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.sim.step_error import bucket, step_errors
from heddle.sim.warmup import BACK_TO_BACK_S, DEFAULT_GAPS_S
from heddle.workloads import get_workload

# (workload, generator options) scaled so a 2-core CPU serves them in tens of seconds.
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": {"length_scale": 0.25},
    "long-prompt-mix": {"length_scale": 0.2, "long_share": 0.1},
}
METRICS = ("ttft", "tpot", "e2e")
GAP_EDGES_S = (0.0005, 0.002, 0.01, 0.1)  # bins of the idle gap before a real step
# A real step over this many times the profile's price for its shape is a stall: the machine
# (another process on a core, the host), not the shape (the worst shape errors are ~1.5x).
STALL_FACTOR = 3.0
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


def canary_shapes(args: argparse.Namespace, executor: Any) -> list[StepShape]:
    """A fixed set of steps like a running engine's (not the profile's own: another seed)."""
    return profile_shapes(args.budget, args.max_num_seqs, 1024,
                          executor.num_blocks * executor.block_size,
                          num_shapes=args.canary, seed=args.seed + 1)  # fmt: skip


def canary(executor: Any, cost: Any, shapes: list[StepShape], vocab: int) -> list[float]:
    """The machine's speed now against the profile's: the canary shapes timed as the profile
    times a shape, measured / the profile's price; [median, p10, p90] of the ratios."""
    timed = profile_executor(executor.execute, shapes, executor.block_size, repeats=3,
                             num_blocks=executor.num_blocks, vocab_size=vocab)  # fmt: skip
    model = cost.executor_only()
    ratios = sorted(t / model.step_time(s) for s, t in timed)
    return [statistics.median(ratios), ratios[len(ratios) // 10],
            ratios[min(len(ratios) - 1, 9 * len(ratios) // 10)]]  # fmt: skip


def scaled(cost: ProfiledCostModel, ratio: float) -> ProfiledCostModel:
    """The profile with every step price (not the engine's time around it) times `ratio`."""
    from heddle.sim.profiled import CONSTRAINED_ROWS, HOST_TERMS

    kept = (*HOST_TERMS, CONSTRAINED_ROWS)
    coefficients = {k: v if k in kept else v * ratio for k, v in cost.coefficients.items()}
    return ProfiledCostModel(coefficients, cost.metadata, cost.warmup)


def rescaled_errors(config: EngineConfig, executor: Any, cost: ProfiledCostModel,
                    workload: Any, runs: list[dict[str, Any]],
                    ratios: list[float]) -> dict[str, float]:
    """Median over the runs of each run's relative errors against a simulation priced by
    `scaled(cost, ratio)`, with the run's own ratio (`ratios[i]` for `runs[i]`)."""
    if len(ratios) != len(runs):
        raise ValueError(f"{len(ratios)} ratios for {len(runs)} runs")
    errors: dict[str, list[float]] = {metric: [] for metric in runs[0]["rows"]}
    for run, ratio in zip(runs, ratios, strict=True):
        sim = build_sim_engine(config, model=executor.model_shape,
                               cost_model=scaled(cost, ratio), num_blocks=executor.num_blocks,
                               max_model_len=executor.max_model_len)  # fmt: skip
        summary = summarize(simulate(workload, sim).records)
        for metric, out in errors.items():
            measured = run["rows"][metric]["measured"]
            out.append(_row(measured, _summary_value(summary, metric))["rel_error"])
    return {metric: statistics.median(e) for metric, e in errors.items()}


def run_pair(config: EngineConfig, executor: Any, cost: Any, workload: Any) -> dict[str, Any]:
    """One real run and its simulations (with and without the idle warm-up)."""
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
    real = summarize(real_run.records)
    out: dict[str, Any] = {"steps": recorder.steps, "gaps": recorder.gaps,
                           "elapsed": real_run.elapsed,
                           "stalls": stalls(cost.executor_only(), recorder.steps),
                           "host_gap": host_gap_check(cost, recorder.steps, recorder.gaps)}  # fmt: skip
    for name, model in (("rows", cost), ("rows_shape_only", cost.with_warmup(None))):
        sim = build_sim_engine(
            config,
            model=executor.model_shape,
            cost_model=model,
            num_blocks=executor.num_blocks,
            max_model_len=executor.max_model_len,
        )
        sim_run = simulate(workload, sim)
        out[name] = compare(real, summarize(sim_run.records))
        if name == "rows":
            out["ttft_parts"] = ttft_parts(real_run.records, sim_run.records)
            out["wait_parts"] = {"real": wait_parts(real_run.records, real_run.step_stats),
                                 "sim": wait_parts(sim_run.records, sim_run.step_stats)}
    return out


def wait_parts(records: list[Any], step_log: Any) -> dict[str, float]:
    """Where a request's wait before its first step goes: the share of requests that arrive
    while a step runs, the mean ms left of that step, and the mean ms from its end to the
    request's first schedule (the engine's own work); for requests that arrive at an idle
    engine, the mean ms to their first schedule (the wake; a simulated engine charges it inside
    the first step instead). Means, not medians: the wait is a mixture of the two kinds, whose
    median jumps between them."""
    import bisect

    starts = list(step_log.column("start_time"))
    ends = [s + d for s, d in zip(starts, step_log.column("duration"), strict=True)]
    residual, after, idle, waits = [], [], [], []
    for r in records:
        arrival, first = r.arrival_time, r.first_scheduled_time
        if first is None:
            continue
        waits.append(first - arrival)
        k = bisect.bisect_left(starts, arrival) - 1  # the last step that started before it
        if k >= 0 and ends[k] > arrival:
            residual.append(ends[k] - arrival)
            after.append(first - ends[k])
        else:
            idle.append(first - arrival)
    n = len(residual) + len(idle)

    def mean_ms(values: list[float]) -> float:
        return 1e3 * statistics.fmean(values) if values else float("nan")

    return {"in flight share": len(residual) / n if n else float("nan"),
            "step left ms": mean_ms(residual), "after step ms": mean_ms(after),
            "idle wake ms": mean_ms(idle), "wait ms": mean_ms(waits)}  # fmt: skip


def host_gap_check(cost: Any, steps: list[tuple[StepShape, float]],
                   gaps: list[float | None]) -> list[float]:  # fmt: skip
    """[back-to-back gaps, median real gap ms, median modelled engine time ms] over the real
    run's steps that started at once after the previous one."""
    pairs = [(g, cost.host_time(s)) for (s, _), g in zip(steps, gaps, strict=True)
             if g is not None and g <= BACK_TO_BACK_S]  # fmt: skip
    if not pairs:
        return [0.0, float("nan"), float("nan")]
    return [float(len(pairs)), 1e3 * statistics.median(g for g, _ in pairs),
            1e3 * statistics.median(h for _, h in pairs)]


def stalls(cost: Any, steps: list[tuple[StepShape, float]]) -> list[float]:
    """[stalled steps, seconds they took beyond the model's price]: steps over STALL_FACTOR
    times their price."""
    over = [seconds - cost.step_time(shape) for shape, seconds in steps
            if seconds > STALL_FACTOR * cost.step_time(shape)]  # fmt: skip
    return [float(len(over)), sum(over)]


def ttft_parts(real: list[Any], sim: list[Any]) -> dict[str, float]:
    """Median ms of each request's wait before its first step and of its first schedule to
    its first token, real and simulated."""
    by_id = {r.request_id: r for r in sim}
    parts: dict[str, list[float]] = {"real wait": [], "sim wait": [], "real first steps": [],
                                     "sim first steps": []}  # fmt: skip
    for r in real:
        for who, rec in (("real", r), ("sim", by_id[r.request_id])):
            if rec.first_scheduled_time is None or rec.first_token_time is None:
                continue
            parts[f"{who} wait"].append(rec.first_scheduled_time - rec.arrival_time)
            parts[f"{who} first steps"].append(rec.first_token_time - rec.first_scheduled_time)
    return {k: 1e3 * statistics.median(v) for k, v in parts.items() if v}


def gap_bin(gap: float | None) -> str:
    if gap is None:
        return "first step"
    low = 0.0
    for edge in GAP_EDGES_S:
        if gap < edge:
            return f"{1e3 * low:g}-{1e3 * edge:g} ms"
        low = edge
    return f">={1e3 * low:g} ms"


def by_gap(
    cost: Any, steps: list[tuple[StepShape, float]], gaps: list[float | None]
) -> dict[str, list[float]]:
    """Per (kind of step, idle-gap bin): [steps, median measured / back-to-back prediction]."""
    ratios: dict[str, list[float]] = {}
    shape_only = cost.executor_only()
    for (shape, seconds), gap in zip(steps, gaps, strict=True):
        kind = "with prefill" if shape.prefill_chunks else "decode only"
        ratios.setdefault(f"{kind:12s} gap {gap_bin(gap)}", []).append(
            seconds / shape_only.step_time(shape)
        )
    return {k: [len(v), statistics.median(v)] for k, v in sorted(ratios.items())}


def warmup_step_errors(
    cost: Any, steps: list[tuple[StepShape, float]], gaps: list[float | None]
) -> list[float]:
    """[steps, median |error|, p90 |error|] of the cost model with its idle warm-up at each
    real step's recorded gap, and the median signed error of the steps after an idle gap with
    the warm-up and without it."""
    errors, idle_with, idle_without = [], [], []
    cost = cost.executor_only().with_warmup(cost.warmup)  # the step alone, warm-up added
    for (shape, seconds), gap in zip(steps, gaps, strict=True):
        base = cost.step_time(shape)
        predicted = base + cost.idle_time(gap)
        errors.append(abs(predicted - seconds) / seconds)
        if gap is not None and gap > BACK_TO_BACK_S:
            idle_with.append((predicted - seconds) / seconds)
            idle_without.append((base - seconds) / seconds)
    p90 = sorted(errors)[int(0.9 * (len(errors) - 1))]
    return [float(len(errors)), statistics.median(errors), p90,
            statistics.median(idle_with or [0.0]), statistics.median(idle_without or [0.0])]


def print_idle(idle: dict[str, Any], names: list[str]) -> None:
    print("after an idle gap / back to back, per idle shape (median):")
    for index, (base, *ratios) in idle["per_shape_base_s_and_ratio"].items():
        after = zip(idle["gaps"], ratios, strict=True)
        print(f"  {names[int(index)]:22s} back to back {1e3 * base:7.2f} ms; "
              + ", ".join(f"{1e3 * g:g} ms: {r:.3f}x" for g, r in after))
    print(f"  held-out shapes' after-idle |error|: median "
          f"{100 * idle['held_out_median_abs_with']:.1f}% with the warm-up, "
          f"{100 * idle['held_out_median_abs_without']:.1f}% without")  # fmt: skip



def saved_engine_config(saved: dict[str, Any]) -> EngineConfig:
    """The engine config a saved run's re-simulation uses: its budget and seats (the model's
    dtype and the pool size are unused: the simulator reads the model's shape)."""
    return EngineConfig(
        model=ModelConfig(dtype="float32"),
        cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=saved["budget"], max_num_seqs=saved["max_num_seqs"]
        ),
    )

def resimulate(results_path: str, cost_model_path: str) -> None:
    """Simulate a saved run's cases again with another cost model (e.g. one fit by `heddle
    profile --from-run` to that run's steps) against the real runs' saved measurements."""
    from heddle.model_shape import ModelShape

    saved = json.loads(Path(results_path).read_text())
    cost = ProfiledCostModel.load(cost_model_path)
    config = saved_engine_config(saved)
    shape = ModelShape(**saved["model_shape"])
    print(f"{results_path} re-simulated with {cost_model_path} ({cost.describe()})")
    for case in saved["cases"]:
        workload = get_workload(case["workload"], seed=saved["seed"],
                                num_requests=saved["num_requests"], rate=case["rate"],
                                **case["options"])  # fmt: skip
        sim = build_sim_engine(config, model=shape, cost_model=cost,
                               num_blocks=saved["num_blocks"],
                               max_model_len=saved["max_model_len"])  # fmt: skip
        summary = summarize(simulate(workload, sim).records)
        errors = {}
        for metric in case["runs"][0]["rows"]:
            predicted = _summary_value(summary, metric)
            errors[metric] = statistics.median(
                _row(run["rows"][metric]["measured"], predicted)["rel_error"]
                for run in case["runs"]
            )
        print(f"{case['workload']} @ {case['rate']}: " + ", ".join(
            f"{m} {100 * e:+.1f}%" for m, e in errors.items()))


def table(results_path: str) -> None:
    """The docs' markdown rows of a saved run: median relative errors with the idle warm-up,
    then TTFT p50 / p99 shape-only, the idle-gap bins and the TTFT parts."""
    saved = json.loads(Path(results_path).read_text())
    metrics = [f"{m} {q}" for m in METRICS for q in QUANTILES] + ["output tok/s"]
    print("| workload @ load | " + " | ".join(m.replace("ttft", "TTFT").replace("tpot", "TPOT")
          .replace("e2e", "E2E") for m in metrics) + " |")  # fmt: skip
    print("|---|" + "---:|" * len(metrics))
    for case in saved["cases"]:
        errors = case["median_rel_error"]
        print(f"| {case['workload']} @ {case['rate']} | "
              + " | ".join(f"{100 * errors[m]:+.1f}%".replace("-", "−") for m in metrics) + " |")
    for case in saved["cases"]:
        free = case.get("median_rel_error_stall_free")
        run_stalls = [r.get("stalls") for r in case["runs"]]
        print(f"{case['workload']} @ {case['rate']}: stalls per run {run_stalls}"
              + ("" if free is None else f"; median of the {case['num_stall_free']} stall-free "
                 "runs: " + ", ".join(f"{m} {100 * free[m]:+.1f}%" for m in metrics)))
    for case in saved["cases"]:
        shape_only = case["median_rel_error_shape_only"]
        print(f"{case['workload']} @ {case['rate']}: shape-only TTFT p50 "
              f"{100 * shape_only['ttft p50']:+.1f}%, p99 {100 * shape_only['ttft p99']:+.1f}%; "
              f"TTFT parts {case['ttft_parts_ms']}; between steps {case['between_steps_ms']}")
        for key, (count, ratio) in case["by_gap"].items():
            print(f"    {key:36s} {int(count):5d} {ratio:.3f}")
        runs = [r for r in case["runs"] if "wait_parts" in r]
        for who in ("real", "sim") if runs else ():
            print(f"    wait before the first step, {who}, mean of the runs: " + ", ".join(
                f"{k} {statistics.fmean(r['wait_parts'][who][k] for r in runs):.2f}"
                for k in runs[0]["wait_parts"][who]))
        if runs:
            print("    back-to-back gaps [n, real median ms, modelled ms]: "
                  + "; ".join(str([round(v, 3) for v in r["host_gap"]]) for r in runs))
    print("step error (shape-only):", saved.get("step_error_all"))
    halves(saved, Path(results_path).with_suffix(".steps.json"))
    print("step error with warm-up:", saved.get("step_error_all_with_warmup"))


TARGET_FIGURES = ("ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e p50", "e2e p99",
                  "output tok/s")  # fmt: skip


def targets(paths: list[str]) -> None:
    """The issue's targets over saved runs (one dtype's cases may be split over several
    files): each case's p50/p99 TTFT, TPOT, E2E and throughput (median of its runs), how many
    are within 10%, and the per-step error of each file's profile on its real steps."""
    within = total = within_rescaled = total_rescaled = 0
    for path in paths:
        saved = json.loads(Path(path).read_text())
        for case in saved["cases"]:
            errors = case["median_rel_error"]
            ok = [m for m in TARGET_FIGURES if abs(errors[m]) <= 0.10]
            within += len(ok)
            total += len(TARGET_FIGURES)
            misses = ", ".join(f"{m} {100 * errors[m]:+.1f}%" for m in TARGET_FIGURES
                               if m not in ok)  # fmt: skip
            print(f"{saved['dtype']} {case['workload']} @ {case['rate']} "
                  f"({saved['num_requests']} requests x {len(case['runs'])}): {len(ok)}/"
                  f"{len(TARGET_FIGURES)} within 10%" + (f"; misses: {misses}" if misses else ""))
            rescaled = case.get("median_rel_error_rescaled")
            if rescaled:
                ok_r = [m for m in TARGET_FIGURES if abs(rescaled[m]) <= 0.10]
                within_rescaled += len(ok_r)
                total_rescaled += len(TARGET_FIGURES)
                print(f"  canary {' / '.join(f'{c[0]:.3f}' for c in case['canary'])} (measured "
                      f"/ profile, before and after the runs); priced at the canary's speed: "
                      f"{len(ok_r)}/"
                      f"{len(TARGET_FIGURES)} within 10%: " + ", ".join(
                          f"{m} {100 * rescaled[m]:+.1f}%" for m in TARGET_FIGURES))  # fmt: skip
        steps = saved.get("step_error_all") or [None] * 3
        per_case = [(c["workload"], c["rate"], c["step_error"]["all"]) for c in saved["cases"]]
        print(f"  {path}: per-step |error| over all real steps: "
              + ("n/a" if steps[0] is None else
                 f"{int(steps[0])} steps, median {100 * steps[1]:.1f}%, p90 {100 * steps[2]:.1f}%")
              + "; per case: " + "; ".join(f"{w} @ {r}: {100 * e[1]:.1f}% / {100 * e[2]:.1f}%"
                                          for w, r, e in per_case))  # fmt: skip
    print(f"within 10%: {within} of {total}")
    if total_rescaled:
        print(f"priced at the canary's speed: {within_rescaled} of {total_rescaled}")


def halves(saved: dict[str, Any], steps_path: Path) -> None:
    """Does the idle verdict move with the run's length? Steps with prefill, measured / the
    profile's back-to-back prediction, back to back vs after >= 100 ms idle, in the first and
    the second half of each real run (the step log holds the runs in order)."""
    from heddle.model.step_log import load_step_gaps, load_steps

    if not steps_path.exists():
        return
    cost = ProfiledCostModel(saved["profile"]).executor_only()
    steps, gaps = load_steps(steps_path)[0], load_step_gaps(steps_path)
    counts = [(c["workload"], c["rate"], len(c.get("run_steps", []))) for c in saved["cases"]]
    start = 0
    for workload, rate, _ in counts:
        case = next(c for c in saved["cases"] if (c["workload"], c["rate"]) == (workload, rate))
        ratios: dict[str, list[float]] = {}
        for n in case.get("run_steps", []):
            for half, lo, hi in (("first", start, start + n // 2), ("second", start + n // 2,
                                                                      start + n)):  # fmt: skip
                for (shape, seconds), gap in zip(steps[lo:hi], gaps[lo:hi], strict=True):
                    if not shape.prefill_chunks or gap is None or 5e-4 <= gap < 0.1:
                        continue
                    kind = "back to back" if gap < 5e-4 else "after >= 100 ms"
                    ratios.setdefault(f"{half} half, {kind}", []).append(
                        seconds / cost.step_time(shape))
            start += n
        if ratios:
            print(f"{workload} @ {rate}, steps with prefill, measured / back-to-back profile: "
                  + "; ".join(f"{k} {statistics.median(v):.3f} ({len(v)})"
                              for k, v in sorted(ratios.items())))  # fmt: skip


def save_step_log(output: str, executor: Any, machine: str,
                  steps: list[tuple[StepShape, float]], gaps: list[float | None]) -> Path:  # fmt: skip
    """The real runs' steps beside `output` (`.steps.json`), for `heddle profile --from-run`."""
    path = Path(output).with_suffix(".steps.json")
    save_steps(path, steps, {"dtype": str(executor.dtype), "model": executor.model_name,
                             "machine": machine, "dispatch_rows": list(dispatch_rows(executor))},
               gaps=gaps)  # fmt: skip
    return path


def _summary_value(summary: Any, metric: str) -> float:
    if metric == "output tok/s":
        return float(summary.overall.output_throughput)
    name, q = metric.split()
    return float(getattr(getattr(summary.overall, name), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--rates", default="1.0,2.5", help="two loads, requests/s")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each profiled shape")
    parser.add_argument("--num-mixed", type=int, default=128, help="mixed steps profiled")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over the profile's shapes (heddle profile --rounds)")
    parser.add_argument("--canary", type=int, default=16,
                        help="shapes re-timed before and after each case: the machine's speed "
                        "against the profile's (0: none)")
    parser.add_argument("--decode-runs", default="moving", choices=DECODE_RUNS,
                        help="how a profiled shape's timed runs schedule its decodes")
    parser.add_argument("--no-host", action="store_true",
                        help="profile no engine time around a step and no wake")
    parser.add_argument("--runs", type=int, default=3, help="real + simulated runs of each case")
    parser.add_argument("--output", default="results/sim_fidelity.json")
    parser.add_argument("--idle-repeats", type=int, default=3,
                        help="rounds of the idle warm-up's measurement")
    parser.add_argument("--idle-one-thread", action="store_true",
                        help="also measure the idle warm-up with 1 torch thread (diagnosis)")
    parser.add_argument(
        "--no-idle", action="store_true",
        help="profile no idle warm-up (the shape-only model of the earlier runs)",
    )
    parser.add_argument(
        "--retime", type=int, default=0,
        help="re-time this many of each case's real step shapes in isolation (diagnosis)",
    )  # fmt: skip
    parser.add_argument("--resimulate", default=None, metavar="RESULTS.json",
                        help="no real runs: simulate this saved run's cases with --cost-model")
    parser.add_argument("--cost-model", default=None, metavar="PROFILE.json",
                        help="with --resimulate: the model to simulate with; else use it for "
                        "the real runs' simulations instead of profiling first")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--cases", default=None, metavar="WORKLOAD@RATE,...",
                        help="these cases in this order instead of --workloads x --rates")
    parser.add_argument("--table", default=None, metavar="RESULTS.json",
                        help="print a saved run's figures as the docs' markdown")
    parser.add_argument("--targets", default=None, metavar="RESULTS.json,...",
                        help="the issue's targets over saved runs (comma-separated files)")
    args = parser.parse_args()
    if args.table:
        table(args.table)
        return
    if args.targets:
        targets(args.targets.split(","))
        return
    if args.resimulate:
        if not args.cost_model:
            parser.error("--resimulate needs --cost-model")
        try:
            resimulate(args.resimulate, args.cost_model)
        except (HeddleError, OSError) as e:
            parser.error(str(e))
        return

    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or not names:
        parser.error(f"--workloads: unknown {unknown}; known: {', '.join(WORKLOADS)}")
    try:
        cases = ([(n, float(r)) for n in names for r in args.rates.split(",")] if not args.cases
                 else [(c.split("@")[0], float(c.split("@")[1])) for c in args.cases.split(",")])
    except (ValueError, IndexError):
        parser.error("--rates: comma-separated requests/s; --cases: WORKLOAD@RATE,...")
    if sorted({n for n, _ in cases} - set(WORKLOADS)):
        parser.error(f"--cases: workloads are {', '.join(WORKLOADS)}")
    config = engine_config(args)
    executor = ModelExecutor(config.model, config.cache)
    idle_shape_names = [bucket(s) for s in idle_shapes(args.budget, args.max_num_seqs)]
    vocab = executor.model_shape.vocab_size
    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}"
    started = time.perf_counter()
    if args.cost_model:
        cost = ProfiledCostModel.load(args.cost_model)
        print(f"cost model {args.cost_model}: {cost.describe()} ({executor.dtype}, "
              f"quantization {executor.quantization})")  # fmt: skip
    else:
        profile_samples: list[tuple[StepShape, float]] = []
        cost = profile_model(
            executor,
            max_num_batched_tokens=args.budget,
            max_num_seqs=args.max_num_seqs,
            max_context=1024,
            num_mixed=args.num_mixed,
            repeats=args.repeats,
            seed=args.seed,
            machine=machine,
            idle_gaps=None if args.no_idle else DEFAULT_GAPS_S,
            idle_repeats=args.idle_repeats,
            engine_config=None if args.no_host else config,
            samples_out=profile_samples,
            decode_runs=args.decode_runs,
            rounds=args.rounds,
        )
        # The profile's own timed shapes (the grid's first), to refit without a term or a
        # family of shapes (benchmarks/fidelity_terms.py).
        save_steps(Path(args.output).with_suffix(".profile_steps.json"), profile_samples,
                   {"dtype": str(executor.dtype), "num_grid": cost.metadata.extra["num_grid"],
                    "dispatch_rows": list(dispatch_rows(executor)), "seed": args.seed,
                    "machine": machine})  # fmt: skip
        print(f"profiled {cost.metadata.extra['num_shapes']} shapes in "
              f"{time.perf_counter() - started:.0f} s ({executor.dtype}, quantization "
              f"{executor.quantization})")  # fmt: skip
        # The profile itself, for `heddle simulate --cost-model` and --resimulate.
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        cost.save(Path(args.output).with_suffix(".profile.json"))
    fit = cost.metadata.fit
    if fit is not None:
        print("\n".join(fit.lines()))
    from heddle.cli.profile import layout_lines

    print("\n".join(layout_lines(cost.metadata.extra)))
    idle = cost.metadata.extra.get("idle")
    host = cost.metadata.extra.get("host")
    if host:
        from heddle.model.profiling_host import HostProfile

        print("\n".join(HostProfile(**host).lines()))
    if cost.warmup is not None and idle is not None:
        print("\n".join(cost.warmup.lines()))
        if "per_shape_base_s_and_ratio" in idle:  # measured (a --from-run fit has no shapes)
            print_idle(idle, idle_shape_names)
    one_thread = None
    if args.idle_one_thread and idle is not None:
        # Worker threads that fell asleep, or the machine (caches, clocks)? One thread has no
        # worker to wake: if the warm-up stays, it is not the thread pool's.
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        shapes = idle_shapes(args.budget, args.max_num_seqs)
        samples = profile_idle(executor.execute, shapes, executor.block_size, DEFAULT_GAPS_S,
                               args.idle_repeats, num_blocks=executor.num_blocks,
                               vocab_size=vocab)  # fmt: skip
        torch.set_num_threads(threads)
        one_warmup, one_thread = fit_idle(samples, DEFAULT_GAPS_S)
        print(f"the same with 1 torch thread (was {threads}): "
              + one_warmup.lines()[0].split(": ", 1)[1])
        print_idle(one_thread, idle_shape_names)

    results: dict[str, Any] = {
        "machine": machine,
        "cpu": machine_line(),
        "dtype": str(executor.dtype),
        "quantization": executor.quantization,
        "idle_warmup": None if cost.warmup is None else cost.warmup.to_json(),
        "idle_check": idle,
        "idle_check_one_thread": one_thread,
        "num_requests": args.num_requests,
        "budget": args.budget,
        "max_num_seqs": args.max_num_seqs,
        "seed": args.seed,
        "num_blocks": executor.num_blocks,
        "max_model_len": executor.max_model_len,
        "model_shape": dataclasses.asdict(executor.model_shape),
        "runs_per_case": args.runs,
        "profile": cost.coefficients,
        "cost_model_file": args.cost_model,
        "profile_fit": None if fit is None else fit.lines(),
        "cases": [],
    }
    all_steps: list[tuple[StepShape, float]] = []
    all_gaps: list[float | None] = []
    canaries_of = canary_shapes(args, executor) if args.canary else []
    for name, rate in cases:
        options = WORKLOADS[name]
        workload = get_workload(
            name, seed=args.seed, num_requests=args.num_requests, rate=rate, **options
        )
        runs, steps, gaps, parts = [], [], [], []
        canaries = [canary(executor, cost, canaries_of, vocab)] if args.canary else []
        for _ in range(args.runs):
            pair = run_pair(config, executor, cost, workload)
            runs.append(pair)
            if args.canary:  # after each run: the speed on either side of every run
                canaries.append(canary(executor, cost, canaries_of, vocab))
            steps.extend(pair["steps"])
            gaps.extend(pair["gaps"])
            parts.append(pair["ttft_parts"])
            print(f"{name} @ {rate}: real run {pair['elapsed']:.1f} s, "
                  f"{len(pair['steps'])} steps, {int(pair['stalls'][0])} stalls adding "
                  f"{pair['stalls'][1]:.2f} s")  # fmt: skip
        median = {
            key: {m: statistics.median(r[key][m]["rel_error"] for r in runs)
                  for m in runs[0][key]}
            for key in ("rows", "rows_shape_only")
        }  # fmt: skip
        free = [r for r in runs if not r["stalls"][0]]
        if free:
            median["stall_free"] = {m: statistics.median(r["rows"][m]["rel_error"]
                                                         for r in free)
                                    for m in runs[0]["rows"]}  # fmt: skip
        rescaled = None
        if args.canary:  # each run priced at the mean of the canaries before and after it
            speeds = [(a[0] + b[0]) / 2 for a, b in itertools.pairwise(canaries)]
            rescaled = rescaled_errors(config, executor, cost, workload, runs, speeds)
        per_step = step_errors(cost.executor_only(), steps)
        gap_ratios = by_gap(cost, steps, gaps)
        # The engine's own time between two steps with no wait between them.
        between = [g for g in gaps if g is not None and g < GAP_EDGES_S[1]]
        all_steps.extend(steps)
        all_gaps.extend(gaps)
        results["cases"].append(
            {
                "workload": name,
                "rate": rate,
                "options": options,
                "runs": [{k: r[k] for k in ("rows", "rows_shape_only", "ttft_parts",
                                            "wait_parts", "host_gap", "stalls", "elapsed")}
                         for r in runs],
                "median_rel_error_stall_free": median.get("stall_free"),
                "num_stall_free": len(free),
                "median_rel_error": median["rows"],
                "median_rel_error_shape_only": median["rows_shape_only"],
                "canary": canaries,
                "median_rel_error_rescaled": rescaled,
                "step_error": {
                    b.name: [b.num_steps, b.median_abs, b.p90_abs, b.median_signed]
                    for b in [per_step.overall, *per_step.buckets]
                },
                "by_gap": gap_ratios,
                "run_steps": [len(r["steps"]) for r in runs],
                "between_steps_ms": 1e3 * statistics.median(between) if between else None,
                "ttft_parts_ms": {k: statistics.median(p[k] for p in parts) for k in parts[0]},
            }
        )  # fmt: skip
        print(f"\n{name} @ {rate} req/s, {args.runs} runs of {args.num_requests} requests")
        print(f"{'metric':14s} {'measured':>10s} {'simulated':>10s} {'median error':>13s} "
              f"{'shape-only':>11s}")  # fmt: skip
        for metric in median["rows"]:
            measured = statistics.median(r["rows"][metric]["measured"] for r in runs)
            predicted = runs[0]["rows"][metric]["predicted"]
            print(f"{metric:14s} {measured:10.4f} {predicted:10.4f} "
                  f"{100 * median['rows'][metric]:12.1f}% "
                  f"{100 * median['rows_shape_only'][metric]:10.1f}%")  # fmt: skip
        if rescaled is not None:
            print("canary (measured / profile, median [p10, p90]) before and after each run: "
                  + "; ".join(f"{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}]" for c in canaries))
            print("each run priced at the canary's speed (the profile x the mean of the "
                  "canaries on either side of it): " + ", ".join(
                f"{m} {100 * e:+.1f}%" for m, e in rescaled.items()))
        print("per-step error of the (shape-only) cost model on the real steps:")
        print("\n".join(per_step.lines()))
        print("real step / back-to-back prediction, by the idle gap before the step:")
        for key, (count, ratio) in gap_ratios.items():
            print(f"  {key:36s} {int(count):5d} steps  median {ratio:.3f}")
        if between:
            print(f"engine time between back-to-back steps: median "
                  f"{1e3 * statistics.median(between):.3f} ms")  # fmt: skip
        print("TTFT parts, median ms: " + ", ".join(
            f"{k} {v:.1f}" for k, v in results["cases"][-1]["ttft_parts_ms"].items()))
        for who in ("real", "sim"):
            print(f"wait before the first step, {who} (mean over the runs): " + ", ".join(
                f"{k} {statistics.fmean(r['wait_parts'][who][k] for r in runs):.2f}"
                for k in runs[0]["wait_parts"][who]))
        print("back-to-back gaps [n, real median ms, modelled ms]: "
              + "; ".join(str([round(v, 3) for v in r["host_gap"]]) for r in runs))
        if args.retime:
            retime(executor, steps, args.retime, vocab)
        # What is done so far, in case the run is cut short.
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1))
        save_step_log(args.output, executor, machine, all_steps, all_gaps)
    overall = step_errors(cost.executor_only(), all_steps).overall
    idle_steps = [(s, t) for (s, t), g in zip(all_steps, all_gaps, strict=True)
                  if g is None or g > BACK_TO_BACK_S]  # fmt: skip
    results["step_error_all"] = [overall.num_steps, overall.median_abs, overall.p90_abs]
    with_warmup = warmup_step_errors(cost, all_steps, all_gaps)
    results["step_error_all_with_warmup"] = with_warmup
    print(f"with the idle warm-up at each step's recorded gap: |error| median "
          f"{100 * with_warmup[1]:.1f}%, p90 {100 * with_warmup[2]:.1f}%; the steps after an "
          f"idle gap: median signed {100 * with_warmup[3]:+.1f}% "
          f"(shape-only {100 * with_warmup[4]:+.1f}%)")  # fmt: skip
    results["after_idle_signed_median"] = {
        "shape_only": step_errors(cost.executor_only(), idle_steps).overall.median_signed,
    } if idle_steps else {}  # fmt: skip
    print(f"\nall real steps: {overall.num_steps}, |error| median "
          f"{100 * overall.median_abs:.1f}%, p90 {100 * overall.p90_abs:.1f}%")  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    steps_path = save_step_log(args.output, executor, machine, all_steps, all_gaps)
    print(f"wrote {args.output} and {steps_path} ({len(all_steps)} real steps)")


if __name__ == "__main__":
    main()
