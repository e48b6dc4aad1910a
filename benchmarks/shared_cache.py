"""Does another tenant's memory traffic move heddle's step times? The shared-L3 test.

The fidelity runs (docs/BENCHMARKS.md section 4) saw the same step shapes take 10-25% more or
less time minutes apart on this 2-vCPU KVM guest, with every other process of the box paused.
The guess: the vCPUs share the host's last-level cache and memory bandwidth with other
tenants, and a decode streams all the weights (~540 MB in fp32, ~130 MB in bf16's int4 plan),
about the L3's size, so what the other tenants leave of it sets the step time. Tested here
side by side in one process, on one executor pinned to CPU 0 with one torch thread, while
CPU 1 runs (conditions interleaved over `--rounds`, medians):
- `alone`: nothing;
- `compute`: a busy loop on registers (a busy neighbour core, no memory traffic);
- `stream N MiB`: numpy copying an N MiB array to another over and over (2N MiB touched:
  64 MiB stays in the L3, 1024 MiB streams from DRAM and evicts the L3 as it goes).
Each step shape is timed as the profile times it (`profile_executor`, moving decodes).
`--series S` then times one decode shape back to back for S seconds alone, at the
executor's usual threads and unpinned (how much the speed moves on its own within a
minute, reported per 5-second window).

    python benchmarks/shared_cache.py --dtypes auto,float32 --rounds 3 --series 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.hostinfo import machine_line
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import profile_executor
from heddle.sim.cost_model import StepShape

# The neighbour on CPU 1: `compute` spins, `stream` copies an N MiB array; on SIGTERM it
# prints the GB/s it moved (read + write) and exits.
NEIGHBOUR = r"""
import os, signal, sys, time
os.sched_setaffinity(0, {1})
mode, mib = sys.argv[1], int(sys.argv[2])
done = False
def stop(*_):
    global done
    done = True
signal.signal(signal.SIGTERM, stop)
moved, start = 0, time.perf_counter()
if mode == "stream":
    import numpy as np
    a = np.ones(mib << 17)  # float64: mib MiB
    b = np.empty_like(a)
    print("ready", flush=True)
    start = time.perf_counter()
    while not done:
        np.copyto(b, a)
        moved += 2 * a.nbytes
else:
    print("ready", flush=True)
    x = 0
    while not done:
        for i in range(100000):
            x += i
print(f"{moved / (time.perf_counter() - start) / 1e9:.1f}", flush=True)
"""

SHAPES = {
    "decode 1 x 400": StepShape((), (400,), 1),
    "decode 4 x 256": StepShape((), (256,) * 4, 4),
    "decode 16 x 256": StepShape((), (256,) * 16, 16),
    "prefill 256 + 8 decodes x 128": StepShape(((256, 256),), (128,) * 8, 9),
}


def neighbour(mode: str, mib: int) -> subprocess.Popen[str] | None:
    if mode == "alone":
        return None
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, mode, str(mib)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the neighbour process did not start")
    time.sleep(0.2)  # let it fill the cache
    return proc


def stop(proc: subprocess.Popen[str] | None) -> float | None:
    if proc is None:
        return None
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    return float(out.strip().splitlines()[-1])


def time_shapes(executor: Any, repeats: int) -> dict[str, float]:
    timed = profile_executor(executor.execute, list(SHAPES.values()), executor.block_size,
                             repeats, num_blocks=executor.num_blocks,
                             vocab_size=executor.model_shape.vocab_size)  # fmt: skip
    return {name: t for name, (_, t) in zip(SHAPES, timed, strict=True)}


def series(executor: Any, seconds: float,
           window: float = 5.0) -> list[tuple[float, float, float, int]]:
    """One decode shape (4 x 256, moving) timed back to back for `seconds`: per window of
    `window` seconds, (median ms, p90 / p10, median |step / the window's median - 1|, steps):
    the last is the per-step error a perfect model of this shape would have in that window."""
    shape = SHAPES["decode 4 x 256"]
    out: list[tuple[float, float, float, int]] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        times: list[float] = []
        edge = time.perf_counter() + window
        while time.perf_counter() < edge:
            times.extend(t for _, t in profile_executor(
                executor.execute, [shape] * 4, executor.block_size, 1,
                num_blocks=executor.num_blocks,
                vocab_size=executor.model_shape.vocab_size))  # fmt: skip
        times.sort()
        med = statistics.median(times)
        out.append((1e3 * med, times[9 * len(times) // 10] / times[len(times) // 10],
                    statistics.median(abs(t / med - 1) for t in times), len(times)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="auto,float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each shape")
    parser.add_argument("--stream-mib", default="64,1024",
                        help="array sizes of the streaming neighbour, MiB")
    parser.add_argument("--series", type=float, default=0.0,
                        help="then time one decode shape alone for this many seconds")
    args = parser.parse_args()
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        parser.error("needs 2 CPUs: the executor on CPU 0, the neighbour on CPU 1")
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be >= 1")
    try:
        sizes = [int(m) for m in args.stream_mib.split(",") if m.strip()]
    except ValueError:
        parser.error("--stream-mib: comma-separated integers")
    if any(m < 1 for m in sizes):
        parser.error("--stream-mib: sizes must be >= 1")
    import torch

    print(machine_line(), flush=True)
    conditions = [("alone", 0), ("compute", 0)] + [("stream", m) for m in sizes]
    label = {c: c[0] if c[0] != "stream" else f"stream {c[1]} MiB" for c in conditions}
    for dtype in args.dtypes.split(","):
        config = EngineConfig(model=ModelConfig(dtype=dtype),
                              cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
                              scheduler=SchedulerConfig(max_num_batched_tokens=256,
                                                        max_num_seqs=32))  # fmt: skip
        executor = ModelExecutor(config.model, config.cache)
        threads = torch.get_num_threads()
        affinity = os.sched_getaffinity(0)
        torch.set_num_threads(1)
        os.sched_setaffinity(0, {0})
        times: dict[tuple[str, int], dict[str, list[float]]] = {c: {} for c in conditions}
        rates: dict[tuple[str, int], list[float]] = {c: [] for c in conditions}
        try:
            time_shapes(executor, 1)  # warm the executor
            for r in range(args.rounds):
                for cond in conditions if r % 2 == 0 else conditions[::-1]:
                    proc = neighbour(*cond)
                    try:
                        got = time_shapes(executor, args.repeats)
                    finally:
                        rate = stop(proc)
                    if rate is not None:
                        rates[cond].append(rate)
                    for name, t in got.items():
                        times[cond].setdefault(name, []).append(t)
                    print(f"{dtype} round {r} {label[cond]}: " + ", ".join(
                        f"{1e3 * t:.2f}" for t in got.values()) + " ms", flush=True)
        finally:
            torch.set_num_threads(threads)
            os.sched_setaffinity(0, affinity)
        print(f"\n{dtype} (quantization {executor.quantization}), 1 torch thread on CPU 0; "
              f"median ms over {args.rounds} rounds and against alone")
        heads = [label[c] + ("" if not rates[c] or not rates[c][0] else
                             f" ({statistics.median(rates[c]):.0f} GB/s)")
                 for c in conditions]  # fmt: skip
        print("| step | " + " | ".join(heads) + " |")
        print("|---|" + "---:|" * len(conditions))
        for name in SHAPES:
            alone = statistics.median(times[("alone", 0)][name])
            cells = [f"{1e3 * alone:.2f}"] + [
                f"{1e3 * statistics.median(times[c][name]):.2f} "
                f"({statistics.median(times[c][name]) / alone - 1:+.1%})"
                for c in conditions[1:]]
            print(f"| {name} | " + " | ".join(cells) + " |")
        if args.series:
            print(f"\n{dtype}: decode 4 x 256 back to back for {args.series:.0f} s, "
                  f"{threads} torch threads (per 5 s: median ms, p90/p10, median |step / "
                  f"median - 1|, steps)")
            windows = series(executor, args.series)
            for k, (med, spread, dev, n) in enumerate(windows):
                print(f"  {5 * k:3d}-{5 * k + 5:3d} s: {med:.2f} ms  {spread:.3f}  "
                      f"{100 * dev:.1f}%  {n}")
            meds = [w[0] for w in windows]
            print(f"  windows' medians: min {min(meds):.2f}, max {max(meds):.2f} ms "
                  f"({max(meds) / min(meds) - 1:+.1%})", flush=True)
        del executor


if __name__ == "__main__":
    main()
