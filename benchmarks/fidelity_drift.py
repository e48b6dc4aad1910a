"""Did the machine's speed move within a fidelity case? The real steps against the profile, in
order, from a saved `benchmarks/sim_fidelity.py` run (RESULTS.json, its `.steps.json` and
`.profile.json` beside it).

- For each case and each of its real runs: the median of measured / the profile's price for
  the step's shape over each third of the run, for back-to-back decode-only steps and for
  back-to-back steps with a prompt chunk apart (steps after an idle gap carry the idle
  warm-up, priced apart); beside them the case's canaries (fixed shapes timed before and after
  each run). A model error is alike in every third (the same kinds of steps recur all through
  a run); a speed that moves shows as thirds, and runs, that differ.
- `--own-speed`: each run simulated again with the profile's step prices times that run's
  own speed (the median of measured / price over its back-to-back steps), against that run's
  measured figures; medians over the runs, and how many of the issue's 7 figures per case are
  within 10%. This takes the machine's speed during the run as known and asks whether the
  model's relative prices (shape against shape) give the figures: what is left is the model's
  error, not the drift. Virtual clock; no timing.
- `--layout`: the back-to-back decode-only steps' measured / price by the kind of step before
  them (a step with a prompt chunk: the first decode of the request it admitted, on the fused
  layers after the eager ones; or another decode) and batch size, and how far the runs' block
  tables were spread over the pool (breaks per decode row, from the step log; logs before the
  block-layout term have none).

    python benchmarks/fidelity_drift.py results/s1/auto/sim_fidelity.json --own-speed
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sim_fidelity import (
    GAP_EDGES_S,
    TARGET_FIGURES,
    _row,
    _summary_value,
    saved_engine_config,
    scaled,
)

from heddle.errors import HeddleError
from heddle.metrics import summarize
from heddle.model.step_log import load_step_gaps, load_steps
from heddle.model_shape import ModelShape
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload

PARTS = 3
# No idle gap before a step: the engine's own time between two steps (a request's admission
# included, ~1-2 ms) but no sleep.
NO_IDLE_S = GAP_EDGES_S[1]
Steps = list[tuple[StepShape, float]]


def back_to_back(steps: Steps, gaps: list[float | None]) -> Steps:
    """The steps that followed the one before with no idle gap: under `NO_IDLE_S` of the
    engine's own time between them (a run's first step has no gap)."""
    return [s for s, g in zip(steps, gaps, strict=True) if g is not None and g < NO_IDLE_S]


def ratios_by_part(steps: Steps, cost: Any, parts: int = PARTS) -> dict[str, list[float | None]]:
    """{kind: [median measured / price of each of `parts` consecutive parts]} for the kinds
    'decode' (decode-only steps) and 'chunk' (steps with a prompt chunk); None where a part has
    no step of that kind."""
    out: dict[str, list[float | None]] = {"decode": [], "chunk": []}
    n = len(steps)
    for p in range(parts):
        part = steps[p * n // parts:(p + 1) * n // parts]
        for kind in out:
            r = [t / cost.step_time(s) for s, t in part
                 if bool(s.prefill_chunks) == (kind == "chunk")]  # fmt: skip
            out[kind].append(statistics.median(r) if r else None)
    return out


def split_runs(saved: dict[str, Any], steps: Steps,
               gaps: list[float | None]) -> list[list[tuple[Steps, list[float | None]]]]:
    """Each case's runs' (steps, gaps), in the order the step log holds them."""
    if not saved.get("cases"):
        raise ValueError("the results hold no case")
    if len(gaps) != len(steps):
        raise ValueError(f"{len(steps)} steps but {len(gaps)} gaps in the step log")
    start = 0
    out = []
    for case in saved["cases"]:
        runs = []
        for n in case["run_steps"]:
            if start + n > len(steps):
                raise ValueError(f"the step log has {len(steps)} steps, the results count more")
            runs.append((steps[start:start + n], gaps[start:start + n]))
            start += n
        out.append(runs)
    if start != len(steps):
        raise ValueError(f"the step log has {len(steps)} steps, the results count {start}")
    return out


def own_speed(saved: dict[str, Any], cost: ProfiledCostModel, case: dict[str, Any],
              runs: list[tuple[Steps, list[float | None]]]) -> tuple[list[float], dict[str, float]]:
    """(each run's speed, median over the runs of each figure's relative error) with each run
    simulated at its own speed."""
    config = saved_engine_config(saved)
    workload = get_workload(case["workload"], seed=saved["seed"],
                            num_requests=saved["num_requests"], rate=case["rate"],
                            **case["options"])  # fmt: skip
    price = cost.executor_only()
    speeds, errors = [], {m: [] for m in TARGET_FIGURES}  # type: dict[str, list[float]]
    for (steps, gaps), measured in zip(runs, case["runs"], strict=True):
        speed = statistics.median(t / price.step_time(s) for s, t in back_to_back(steps, gaps))
        speeds.append(speed)
        sim = build_sim_engine(config, model=ModelShape(**saved["model_shape"]),
                               cost_model=scaled(cost, speed), num_blocks=saved["num_blocks"],
                               max_model_len=saved["max_model_len"])  # fmt: skip
        summary = summarize(simulate(workload, sim).records)
        for m, out in errors.items():
            out.append(_row(measured["rows"][m]["measured"], _summary_value(summary, m))[
                "rel_error"])
    return speeds, {m: statistics.median(e) for m, e in errors.items()}


def after_kind(steps: Steps, gaps: list[float | None], price: Any) -> dict[tuple[str, str],
                                                                          list[float]]:
    """(step before, batch) -> measured / price of the back-to-back decode-only steps."""
    groups: dict[tuple[str, str], list[float]] = {}
    previous: StepShape | None = None
    for (shape, seconds), gap in zip(steps, gaps, strict=True):
        if (not shape.prefill_chunks and previous is not None and gap is not None
                and gap < NO_IDLE_S):  # fmt: skip
            before = "a prompt chunk" if previous.prefill_chunks else "a decode"
            n = shape.num_decode_tokens
            batch = "1" if n == 1 else "2-4" if n <= 4 else "5+"
            groups.setdefault((before, batch), []).append(seconds / price.step_time(shape))
        previous = shape
    return groups


def print_layout(steps: Steps, gaps: list[float | None], price: Any, block_size: int) -> None:
    print("\nback-to-back decode-only steps by the step before them, measured / price:")
    print("| step before | decodes | steps | median |")
    print("|---|---:|---:|---:|")
    for (before, batch), ratios in sorted(after_kind(steps, gaps, price).items()):
        print(f"| {before} | {batch} | {len(ratios)} | {statistics.median(ratios):.3f} |")
    decode = [s for s, _ in steps if s.num_decode_tokens]
    rows = sum(s.num_decode_tokens for s in decode)
    breaks = sum(s.decode_block_breaks for s in decode)
    blocks = sum(s.decode_context_tokens for s in decode) / block_size
    print(f"block tables: {breaks / max(1, rows):.2f} breaks per decode row over {rows} rows "
          f"({100 * breaks / max(1.0, blocks):.1f}% of their ~{blocks / max(1, rows):.1f} "
          f"blocks; a table scattered over the whole pool breaks at ~100%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a sim_fidelity.py RESULTS.json (its .steps.json and "
                        ".profile.json beside it)")
    parser.add_argument("--own-speed", action="store_true",
                        help="also simulate each run at its own speed (virtual clock)")
    parser.add_argument("--layout", action="store_true",
                        help="decode steps by the step before them; the tables' breaks")
    args = parser.parse_args()
    path = Path(args.results)
    try:
        saved = json.loads(path.read_text())
        steps_path = path.with_suffix(".steps.json")
        steps, gaps = load_steps(steps_path)[0], load_step_gaps(steps_path)
        runs_of = split_runs(saved, steps, gaps)
        cost = (ProfiledCostModel.load(path.with_suffix(".profile.json")) if args.own_speed
                else ProfiledCostModel(saved["profile"]))  # fmt: skip
    except (OSError, ValueError, KeyError, HeddleError) as e:
        sys.exit(f"fidelity_drift: {e}")
    price = cost.executor_only()
    print(f"{saved.get('cpu', saved.get('machine'))}; {saved['dtype']}; back-to-back steps, "
          f"measured / the profile's price, median over each third of a run")
    print("| case | canary before / after each run | run | decode-only, thirds | "
          "with a chunk, thirds |")
    print("|---|---|---:|---|---|")
    for case, runs in zip(saved["cases"], runs_of, strict=True):
        canary = " / ".join(f"{c[0]:.3f}" for c in case.get("canary") or [])
        for k, (run_steps, run_gaps) in enumerate(runs):
            parts = ratios_by_part(back_to_back(run_steps, run_gaps), price)
            cells = [" / ".join("-" if v is None else f"{v:.3f}" for v in parts[kind])
                     for kind in ("decode", "chunk")]  # fmt: skip
            print(f"| {case['workload'] + ' @ ' + str(case['rate']) if k == 0 else ''} | "
                  f"{canary if k == 0 else ''} | {k + 1} | {cells[0]} | {cells[1]} |")
    if args.layout:
        print_layout(steps, gaps, price, int(cost.metadata.extra.get("block_size", 16)))
    if not args.own_speed:
        return
    within = total = 0
    print("\neach run simulated at its own speed (the profile's step prices x the run's median "
          "measured / price), median over the runs:")
    print("| case | runs' speeds | " + " | ".join(TARGET_FIGURES) + " | within 10% |")
    print("|---|---|" + "---:|" * (len(TARGET_FIGURES) + 1))
    for case, runs in zip(saved["cases"], runs_of, strict=True):
        speeds, errors = own_speed(saved, cost, case, runs)
        ok = sum(abs(errors[m]) <= 0.10 for m in TARGET_FIGURES)
        within += ok
        total += len(TARGET_FIGURES)
        print(f"| {case['workload']} @ {case['rate']} | "
              + " / ".join(f"{s:.3f}" for s in speeds) + " | "
              + " | ".join(f"{100 * errors[m]:+.1f}%" for m in TARGET_FIGURES)
              + f" | {ok}/{len(TARGET_FIGURES)} |")
    print(f"within 10% at each run's own speed: {within} of {total}")


if __name__ == "__main__":
    main()
