"""What the cyclic garbage collector costs a simulation: the most any collector tuning can save.

The issue-9 command's simulation (`heddle simulate --workload chat --rate 20 --model
llama-3.1-8b --hardware h100`, its defaults: builtin block hash, 8192-token budget, 256
seats), run in one process with CPython's default collector thresholds (what `simulate`
does) and with the young threshold raised to 100,000 and the pre-run objects frozen
(`gc.freeze`), alternated, ROUNDS times each. Reports the simulation's wall time, the time
spent inside collections (gc.callbacks) and the collections per generation, and checks that
both sides took the same decisions (steps, preemptions, every request's finish time and
token count).

    /work/tools/bench timeout 300 /work/tools/py benchmarks/sim_gc.py --num-requests 20000
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from heddle.cli.main import build_parser
from heddle.engine.replay import replay
from heddle.hostinfo import machine_line
from heddle.sim.cli import build_once

RELAXED = (100_000, 20, 10)


@contextmanager
def relaxed_gc() -> Iterator[None]:
    """The young threshold raised to RELAXED, what exists now frozen; both restored after."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*RELAXED)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


class _GcTimer:
    """Wall seconds spent inside collections, and their number per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


def _one(num_requests: int, mode: str) -> dict[str, Any]:
    args = build_parser().parse_args(
        ["simulate", "--workload", "chat", "--rate", "20", "--num-requests", str(num_requests),
         "--model", "llama-3.1-8b", "--hardware", "h100", "--no-progress"]
    )  # fmt: skip
    workload, engine = build_once(args, 20.0)  # what `heddle simulate` runs
    timer = _GcTimer()
    gc.callbacks.append(timer)
    try:
        t0 = time.perf_counter()
        if mode == "relaxed":
            with relaxed_gc():
                result = replay(engine, workload, vocab_size=engine.vocab_size)
        else:
            result = replay(engine, workload, vocab_size=engine.vocab_size)
        wall = time.perf_counter() - t0
    finally:
        gc.callbacks.remove(timer)
    decisions = [
        (r.request_id, r.finish_time, len(r.token_times), r.num_preemptions)
        for r in result.records
    ]
    return {
        "mode": mode,
        "wall_s": wall,
        "gc_s": timer.seconds,
        "collections": timer.collections,
        "steps": result.num_steps,
        "preemptions": result.num_preemptions,
        "decisions": hash(tuple(decisions)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default="results/sim_gc.json")
    args = parser.parse_args()
    print(machine_line())
    print(f"gc thresholds: default {gc.get_threshold()}, relaxed {RELAXED}")
    rows = []
    for round_ in range(1, args.rounds + 1):
        for mode in ("default", "relaxed"):
            row = _one(args.num_requests, mode)
            row["round"] = round_
            rows.append(row)
            gc.collect()  # the previous run's engine and records, before the next starts
            print(
                f"round {round_} {mode:8s} simulation {row['wall_s']:.2f} s, in collections "
                f"{row['gc_s']:.2f} s ({100 * row['gc_s'] / row['wall_s']:.1f}%), "
                f"collections per generation {row['collections']}, {row['steps']} steps",
                flush=True,
            )
    if len({(r["steps"], r["preemptions"], r["decisions"]) for r in rows}) != 1:
        raise SystemExit("the two sides took different decisions")
    print("same decisions on both sides (steps, preemptions, every record's finish)")
    ratios = [
        relaxed["wall_s"] / default["wall_s"]
        for default, relaxed in zip(rows[0::2], rows[1::2], strict=True)
    ]
    print(
        f"relaxed / default simulation time per round: {', '.join(f'{x:.3f}' for x in ratios)}"
        f" (median {statistics.median(ratios):.3f})"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps({"machine": machine_line(), "rows": rows, "ratios": ratios}, indent=2)
    )


if __name__ == "__main__":
    main()
