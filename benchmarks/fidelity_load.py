"""Is a fidelity case's load past what this machine serves? Capacity, stalls and sensitivity.

A companion of benchmarks/sim_fidelity.py, on its saved output (RESULTS.json and the real
runs' step log beside it). Everything here runs on the virtual clock (no timed figure):

- `--runs`: each recorded real run's busy and idle seconds, its steps, and its *stalls* (steps
  that took over `--stall-factor` times the cost model's price for their shape) with the
  seconds they added; then the simulation against each real run apart (not only the median).
- `--capacity`: the saturated throughput of the simulated engine (requests/s with every
  request waiting from t=0, counted between the 25% and 75% completions, where all seats are
  busy), for several run lengths (the figure must not move with the length), and what a
  case's rate is as a share of it.
- `--sensitivity`: each case simulated again with the stalls the real runs showed (one burst
  of `--stall-steps` steps each `--stall-seconds` slower at a random step; `--trials` seeds),
  and with i.i.d. per-step noise (`--noise`, lognormal sigma): how far each latency figure
  moves from the undisturbed simulation. Near capacity a stall's backlog drains at the rate
  (capacity - load), so the same stall moves every figure much more than at a light load.

    python benchmarks/fidelity_load.py results/fidelity_auto/sim_fidelity.json \
        --cost-model results/fidelity_auto/fromrun_4,8.json --runs --capacity --sensitivity
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from sim_fidelity import WORKLOADS  # the script's neighbour (benchmarks/ is on sys.path)

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.errors import HeddleError
from heddle.metrics import summarize
from heddle.model.step_log import shape_from_json
from heddle.model_shape import ModelShape
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload

FIGURES = ("ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e p50", "e2e p99", "output tok/s")


class Disturbed(CostModel):
    """`base`'s prices, with steps `stall_at .. stall_at + stall_steps - 1` each `stall_seconds`
    slower and every step times a lognormal factor of sigma `noise` (seeded)."""

    def __init__(self, base: Any, *, stall_at: int = -1, stall_steps: int = 0,
                 stall_seconds: float = 0.0, noise: float = 0.0, seed: int = 0) -> None:
        self.base = base
        self.stall = range(stall_at, stall_at + stall_steps)
        self.stall_seconds = stall_seconds
        self.noise = noise
        self.rng = random.Random(seed)
        self.step = 0

    def step_time(self, shape: StepShape) -> float:
        seconds = self.base.step_time(shape)
        if shape.is_empty:
            return seconds
        if self.noise:
            seconds *= self.rng.lognormvariate(0.0, self.noise)
        if self.step in self.stall:
            seconds += self.stall_seconds
        self.step += 1
        return seconds

    def idle_time(self, gap: float | None) -> float:
        return float(self.base.idle_time(gap))

    @property
    def charges_idle(self) -> bool:
        return bool(self.base.charges_idle)

    def describe(self) -> str:
        return f"disturbed({self.base.describe()})"


def sim_config(saved: dict[str, Any]) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(dtype="float32"),  # unused: the simulator reads the model's shape
        cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
        scheduler=SchedulerConfig(max_num_batched_tokens=saved["budget"],
                                  max_num_seqs=saved["max_num_seqs"]),
    )  # fmt: skip


def run_sim(saved: dict[str, Any], cost: Any, workload_name: str, options: dict[str, Any],
            rate: float, num_requests: int) -> Any:  # fmt: skip
    workload = get_workload(workload_name, seed=saved["seed"], num_requests=num_requests,
                            rate=rate, **options)  # fmt: skip
    engine = build_sim_engine(sim_config(saved), model=ModelShape(**saved["model_shape"]),
                              cost_model=cost, num_blocks=saved["num_blocks"],
                              max_model_len=saved["max_model_len"])  # fmt: skip
    return simulate(workload, engine)


def value(summary: Any, figure: str) -> float:
    if figure == "output tok/s":
        return float(summary.overall.output_throughput)
    name, q = figure.split()
    return float(getattr(getattr(summary.overall, name), q))


def real_runs(saved: dict[str, Any], steps_path: Path, cost: Any, factor: float) -> None:
    """Per recorded run: busy / idle seconds, steps, stalls; the simulation against each run."""
    steps = json.loads(steps_path.read_text())["steps"]
    start = 0
    price = cost.executor_only()  # what the executor's step_duration measured
    print(f"real runs ({steps_path}); stall = a step over {factor:g}x the model's price")
    for case in saved["cases"]:
        sim = summarize(run_sim(saved, cost, case["workload"], case["options"], case["rate"],
                                saved["num_requests"]).records)  # fmt: skip
        print(f"{case['workload']} @ {case['rate']}: simulated "
              + ", ".join(f"{f} {value(sim, f):.4g}" for f in FIGURES))  # fmt: skip
        for index, count in enumerate(case["run_steps"]):
            run = steps[start:start + count]
            start += count
            busy = sum(s["seconds"] for s in run)
            idle = sum(s["idle_before"] or 0.0 for s in run)
            stalls = [(k, s["seconds"], price.step_time(shape_from_json(s)))
                      for k, s in enumerate(run)
                      if s["seconds"] > factor * price.step_time(shape_from_json(s))]  # fmt: skip
            lost = sum(t - p for _, t, p in stalls)
            rows = case["runs"][index]["rows"]
            errors = ", ".join(
                f"{f} {100 * (value(sim, f) - rows[f]['measured']) / rows[f]['measured']:+.1f}%"
                for f in FIGURES
            )
            where = f" at steps {stalls[0][0]}-{stalls[-1][0]}" if stalls else ""
            print(f"  run {index + 1}: {count} steps, busy {busy:.2f} s, idle {idle:.2f} s, "
                  f"{len(stalls)} stalls{where} adding {lost:.2f} s; sim vs this run: {errors}")


def capacity(saved: dict[str, Any], cost: Any, workload_name: str, options: dict[str, Any],
             lengths: list[int]) -> list[float]:  # fmt: skip
    """Saturated requests/s (all requests at t=0, between the 25% and 75% completions) for
    each run length."""
    if min(lengths) < 8:
        raise SystemExit(f"error: --capacity needs runs of >= 8 requests, got {lengths}")
    out = []
    for n in lengths:
        records = run_sim(saved, cost, workload_name, options, 1e6, n).records
        done = sorted(r.finish_time for r in records if r.finish_time is not None)
        lo, hi = done[len(done) // 4], done[(3 * len(done)) // 4]
        out.append(((3 * len(done)) // 4 - len(done) // 4) / (hi - lo))
    return out


def sweep(saved: dict[str, Any], cost: Any, workload_name: str, options: dict[str, Any],
          rates: list[float], lengths: list[int]) -> None:  # fmt: skip
    """Open-loop arrivals at each rate, for each run length: past capacity the queue (and so
    the TTFT) grows with the run's length; below it, it does not."""
    for rate in rates:
        cells = []
        for n in lengths:
            run = run_sim(saved, cost, workload_name, options, rate, n)
            summary = summarize(run.records)
            cells.append(f"{n}: TTFT p50 {1e3 * summary.overall.ttft.p50:7.1f} ms, "
                         f"E2E p50 {summary.overall.e2e.p50:6.2f} s, "
                         f"{run.num_preemptions} preemptions")  # fmt: skip
        print(f"  {workload_name} @ {rate:g} req/s  " + " | ".join(cells))


def sensitivity(saved: dict[str, Any], cost: Any, case: dict[str, Any], args: Any,
                num_requests: int) -> None:  # fmt: skip
    """Each figure's move when one stall (or i.i.d. noise) disturbs a run of `num_requests`."""
    base_run = run_sim(saved, cost, case["workload"], case["options"], case["rate"],
                       num_requests)  # fmt: skip
    base = summarize(base_run.records)
    span = max(10, base_run.num_steps)  # the stall starts in the run's first half
    for label, kwargs in (
        (f"stall {args.stall_steps} x {args.stall_seconds:g} s",
         {"stall_steps": args.stall_steps, "stall_seconds": args.stall_seconds}),
        (f"noise sigma {args.noise:g}", {"noise": args.noise}),
    ):  # fmt: skip
        moves: dict[str, list[float]] = {f: [] for f in FIGURES}
        for trial in range(args.trials):
            rng = random.Random(trial)
            model = Disturbed(cost, stall_at=rng.randrange(span // 10, span // 2), seed=trial,
                              **kwargs)  # fmt: skip
            summary = summarize(run_sim(saved, model, case["workload"], case["options"],
                                        case["rate"], num_requests).records)  # fmt: skip
            for f in FIGURES:
                moves[f].append((value(summary, f) - value(base, f)) / value(base, f))
        print(f"  {num_requests} requests, {label:22s} " + ", ".join(
            f"{f} {100 * statistics.median(v):+.0f}% [{100 * min(v):+.0f}, {100 * max(v):+.0f}]"
            for f, v in moves.items()))  # fmt: skip


def lengths_of(text: str | None, default: int) -> list[int]:
    try:
        lengths = [default] if text is None else [int(n) for n in text.split(",")]
    except ValueError:
        raise SystemExit(f"error: run lengths are comma-separated integers, got {text!r}") from None
    if min(lengths) < 1:
        raise SystemExit(f"error: run lengths must be >= 1, got {text!r}")
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="sim_fidelity.py's RESULTS.json")
    parser.add_argument("--cost-model", default=None, metavar="PROFILE.json",
                        help="default: the profile saved in RESULTS.json")
    parser.add_argument("--runs", action="store_true", help="the recorded real runs, per run")
    parser.add_argument("--stall-factor", type=float, default=3.0)
    parser.add_argument("--capacity", action="store_true")
    parser.add_argument("--lengths", default="60,120,240", help="run lengths for --capacity")
    parser.add_argument("--sweep", default=None, metavar="RATES",
                        help="open-loop rates (req/s) to simulate at each --lengths")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument("--sensitivity-lengths", default=None, metavar="N,N,...",
                        help="run lengths for --sensitivity (default: the saved runs' length)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--stall-steps", type=int, default=5)
    parser.add_argument("--stall-seconds", type=float, default=0.3)
    parser.add_argument("--noise", type=float, default=0.05)
    args = parser.parse_args()
    path = Path(args.results)
    if not path.is_file():
        raise SystemExit(f"error: no results file at {path}")
    saved = json.loads(path.read_text())
    try:
        cost = (ProfiledCostModel.load(args.cost_model) if args.cost_model
                else ProfiledCostModel(saved["profile"]))  # fmt: skip
    except HeddleError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"{path}: {saved.get('cpu')}, {saved.get('dtype')}; cost model {cost.describe()}")
    if args.runs:
        steps_path = path.with_suffix(".steps.json")
        if not steps_path.is_file():
            raise SystemExit(f"error: --runs needs the step log {steps_path}")
        real_runs(saved, steps_path, cost, args.stall_factor)
    if args.capacity:
        lengths = lengths_of(args.lengths, 0)
        for name, options in WORKLOADS.items():
            caps = capacity(saved, cost, name, options, lengths)
            rates = sorted({c["rate"] for c in saved["cases"]})
            print(f"capacity {name}: " + ", ".join(
                f"{n} requests {c:.2f} req/s" for n, c in zip(lengths, caps, strict=True))
                + "; loads " + ", ".join(f"{r:g} = {r / caps[-1]:.2f}x" for r in rates))
    if args.sweep:
        lengths = lengths_of(args.lengths, 0)
        rates = [float(r) for r in args.sweep.split(",")]
        for name, options in WORKLOADS.items():
            sweep(saved, cost, name, options, rates, lengths)
    if args.sensitivity:
        for case in saved["cases"]:
            print(f"sensitivity {case['workload']} @ {case['rate']} ({args.trials} trials; "
                  "median move [min, max] vs the undisturbed simulation):")
            for n in lengths_of(args.sensitivity_lengths, saved["num_requests"]):
                sensitivity(saved, cost, case, args, n)


if __name__ == "__main__":
    main()
