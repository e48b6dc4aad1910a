"""What a steady decode step of the simulator executes, counted rather than timed.

`heddle simulate`'s engine (Llama-3.1-8B / H100 roofline, 8192-token budget, 256 seats,
builtin block hash) with R requests that only decode (as in benchmarks/sim_row_floor.py).
Over --steps steps it counts the bytecodes CPython executes (`sys.settrace` with opcode
events), split by phase: `Scheduler.schedule`, the executor's `execute`, `Scheduler.update`
and the rest of `Engine.step`. The counts do not depend on the machine or its load, so two
versions of the code compare exactly (run it from each worktree). With --instructions
(needs valgrind) it also prints the machine instructions of a step, from two callgrind runs
of N0 and N0 + --steps steps (the difference cancels imports and setup; the cyclic
collector is off in both, so its timing does not enter).

    /work/tools/cpu /work/tools/py benchmarks/sim_step_bytecodes.py
    /work/tools/cpu /work/tools/py benchmarks/sim_step_bytecodes.py --instructions
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import re
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import heddle
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from heddle.sim.simulator import build_sim_engine

PHASES = ("schedule", "execute", "update")


def decoding_engine(rows: int) -> Engine:
    """The engine with `rows` requests past their prefill, decoding."""
    config = EngineConfig(
        cache=CacheConfig(block_size=16, block_hash="builtin"),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
    )
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    for i in range(rows):
        engine.add_request(
            f"r{i}",
            [100 + (7 * i + j) % 30000 for j in range(160)],
            SamplingParams(max_tokens=1_000_000, ignore_eos=True),
            true_output_len=1_000_000,
        )
    for _ in range(3):
        engine.step()  # the prefills, and the first decodes
    return engine


def count_bytecodes(rows: int, steps: int) -> dict[str, float]:
    """Bytecodes per step by phase (the outermost of PHASES on the stack, else "other")."""
    engine = decoding_engine(rows)
    counts: collections.Counter[str] = collections.Counter()
    current: list[Any] = [None, None]  # phase, its frame

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "call" and current[0] is None and frame.f_code.co_name in PHASES:
            current[0], current[1] = frame.f_code.co_name, frame
        elif event == "return" and frame is current[1]:
            current[0] = current[1] = None
        elif event == "opcode":
            counts[current[0] or "other"] += 1
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(steps):
            engine.step()
    finally:
        sys.settrace(None)
    return {phase: counts[phase] / steps for phase in (*PHASES, "other")}


def run_steps(rows: int, steps: int) -> None:
    """The callgrind target: `steps` steps, collector off."""
    engine = decoding_engine(rows)
    gc.disable()
    for _ in range(steps):
        engine.step()


def instructions_per_step(rows: int, steps: int, base_steps: int = 100) -> float:
    """Machine instructions per step: callgrind of base_steps and base_steps + steps."""
    totals = []
    for n in (base_steps, base_steps + steps):
        out = subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                sys.executable, __file__, "--run", str(n), "--rows", str(rows),
            ],
            capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=67)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--instructions", action="store_true", help="also callgrind (slow)")
    parser.add_argument("--run", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_steps(args.rows, args.run)
        return
    if args.rows < 1 or args.steps < 1:
        parser.error("--rows and --steps must be at least 1")
    print(f"heddle from {Path(heddle.__file__).resolve().parent.parent}; {args.rows} decoding rows")
    per_step = count_bytecodes(args.rows, args.steps)
    for phase, count in per_step.items():
        print(f"{phase:9s} {count:8.0f} bytecodes / step  {count / args.rows:6.1f} / row")
    total = sum(per_step.values())
    print(f"{'total':9s} {total:8.0f} bytecodes / step  {total / args.rows:6.1f} / row")
    if args.instructions:
        ir = instructions_per_step(args.rows, args.steps)
        print(f"instructions: {ir:,.0f} / step, {ir / total:.1f} per bytecode")


if __name__ == "__main__":
    main()
