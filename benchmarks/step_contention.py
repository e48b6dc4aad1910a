"""What one busy core does to the real engine's steps on this 2-core machine.

A stall in sim_fidelity.py's real runs is a step of an ordinary shape taking 10-20x its price.
This times a few such shapes (median of `--repeats`, heddle/model/profiling.py's timing) alone
and with one busy-looping process beside them (any other process on a core: a job outside the
bench lock, the host), in rounds alone / busy / alone / busy; the ratio busy / alone per shape.

    python benchmarks/step_contention.py --dtype auto
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from sim_fidelity import cpu_model

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import profile_executor
from heddle.sim.cost_model import StepShape
from heddle.sim.step_error import bucket

SHAPES = [
    StepShape((), (40,) * 7),  # the decode batch of the long-prompt @ 2.5 stalls
    StepShape((), (128,)),
    StepShape(((256, 256),), (), num_sampled=1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    executor = ModelExecutor(ModelConfig(dtype=args.dtype),
                             CacheConfig(block_size=16, kv_cache_memory_gb=0.5))  # fmt: skip
    print(f"{cpu_model()}; {executor.dtype}, {torch.get_num_threads()} torch threads")
    times: dict[str, list[list[float]]] = {"alone": [], "busy": []}

    def measure() -> list[float]:
        samples = profile_executor(executor.execute, SHAPES, executor.block_size,
                                   repeats=args.repeats, warmup=2,
                                   num_blocks=executor.num_blocks,
                                   vocab_size=executor.model_shape.vocab_size)  # fmt: skip
        return [seconds for _, seconds in samples]

    for _ in range(args.rounds):
        times["alone"].append(measure())
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)
            times["busy"].append(measure())
        finally:
            spinner.kill()
            spinner.wait()
    for index, shape in enumerate(SHAPES):
        alone = statistics.median(r[index] for r in times["alone"])
        busy = statistics.median(r[index] for r in times["busy"])
        print(f"{bucket(shape):24s} alone {1e3 * alone:7.2f} ms, one core busy "
              f"{1e3 * busy:7.2f} ms: {busy / alone:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
