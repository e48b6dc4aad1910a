"""Where the simulator's step time goes: its fixed part, its cost per decoding row, and the
floor a row-by-row step has in CPython.

1. The engine: `heddle simulate`'s engine (Llama-3.1-8B / H100 roofline, 8192-token budget,
   256 seats, builtin block hash) with R requests decoding and nothing else (long outputs, no
   arrivals): wall microseconds per `Engine.step()` (schedule -> execute -> update, block
   boundaries, prefix commits and the step log included) for R in --rows, median of
   --repeats runs of --steps steps. A least-squares line gives the fixed cost per step and
   the cost per row.
2. The floor: the least a step must do per decoding row while every row is visited by the
   scheduler, the executor and `update` (what the step contract and a request's fields ask
   today): read the row's computed count and write its three output columns; answer one
   token per row; advance the count, append the token, extend the token-time run. Plain
   `__slots__` objects, no checks, no KV, no policy: the same three visits and nothing else.
3. What the issue's 100k command needs: its 505,822 steps (67.3 rows on average, from
   `heddle simulate`'s report) at the measured fixed and per-row costs, against 60 s.

    /work/tools/bench timeout 120 /work/tools/py benchmarks/sim_row_floor.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.hostinfo import machine_line
from heddle.request import SamplingParams
from heddle.sim.simulator import build_sim_engine

ISSUE_STEPS = 505_822  # the issue's 100k command (every pass's report: the same decisions)
ISSUE_ROWS = 67.3  # its mean batch size
TARGET_S = 60.0


def engine_step_us(rows: int, steps: int) -> float:
    """Wall microseconds per step with `rows` requests decoding (after their prefill)."""
    config = EngineConfig(
        cache=CacheConfig(block_size=16, block_hash="builtin"),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
    )
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    for i in range(rows):
        prompt = [100 + (7 * i + j) % 30000 for j in range(160)]
        engine.add_request(
            f"r{i}",
            prompt,
            SamplingParams(max_tokens=1_000_000, ignore_eos=True),
            true_output_len=1_000_000,
        )
    for _ in range(3):
        engine.step()  # the prefills, and the first decodes
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - t0
    for i in range(rows):
        engine.abort_request(f"r{i}")
    engine.check_integrity()
    return 1e6 * elapsed / steps


class _Row:
    __slots__ = ("num_computed_tokens", "request_id", "token_runs", "tokens")

    def __init__(self, i: int) -> None:
        self.request_id = f"r{i}"
        self.num_computed_tokens = 160
        self.tokens = list(range(161))
        self.token_runs = [0]


def floor_step_us(rows: int, steps: int) -> float:
    """Wall microseconds per step of the three visits per row and nothing else."""
    running = [_Row(i) for i in range(rows)]
    answer = {r.request_id: ([5], 1 << 60) for r in running}
    t0 = time.perf_counter()
    for step in range(steps):
        # The scheduler: one row per running request, written into the output's columns.
        served, ids, starts = [], [], []
        for request in running:
            served.append(request)
            ids.append(request.request_id)
            starts.append(request.num_computed_tokens)
        # The executor: one token per row (EOS where the row reaches its true length).
        sampled = [
            token if start + 1 < eos else [2]
            for (token, eos), start in zip(map(answer.__getitem__, ids), starts, strict=True)
        ]
        # update: the count, the token, the token-time run.
        for request, token_ids in zip(served, sampled, strict=True):
            request.num_computed_tokens += 1
            request.tokens.append(token_ids[0])
            request.token_runs[-1] = step
    return 1e6 * (time.perf_counter() - t0) / steps


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: (fixed, per row)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,67,128")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="results/sim_row_floor.json")
    args = parser.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    print(machine_line())
    engine_pts, floor_pts = [], []
    for r in rows:
        e = statistics.median(engine_step_us(r, args.steps) for _ in range(args.repeats))
        f = statistics.median(floor_step_us(r, args.steps) for _ in range(args.repeats))
        engine_pts.append((r, e))
        floor_pts.append((r, f))
        print(f"{r:4d} rows: engine {e:8.1f} us/step, floor {f:7.1f} us/step", flush=True)
    fixed, per_row = fit(engine_pts)
    floor_fixed, floor_row = fit(floor_pts)
    projected = ISSUE_STEPS * (fixed + ISSUE_ROWS * per_row) / 1e6
    needed_row = (TARGET_S * 1e6 / ISSUE_STEPS - fixed) / ISSUE_ROWS
    print(
        f"engine: {fixed:.1f} us fixed + {per_row:.3f} us per row; floor: {floor_row:.3f} us "
        f"per row ({100 * floor_row / per_row:.0f}% of the engine's)"
    )
    print(
        f"the issue's 100k command at these costs: {ISSUE_STEPS} steps x ({fixed:.1f} + "
        f"{ISSUE_ROWS} x {per_row:.3f}) us = {projected:.1f} s of steady decoding; under "
        f"{TARGET_S:.0f} s needs <= {needed_row:.3f} us per row at this fixed cost"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps(
            {
                "machine": machine_line(),
                "engine_us_per_step": engine_pts,
                "floor_us_per_step": floor_pts,
                "engine_fixed_us": fixed,
                "engine_per_row_us": per_row,
                "floor_per_row_us": floor_row,
                "floor_fixed_us": floor_fixed,
                "projected_100k_s": projected,
                "needed_per_row_us": needed_row,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
