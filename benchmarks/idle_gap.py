"""Is the first step after an idle wait slower than the same step back to back? (issue 18)

Two measurements on the real ModelExecutor:

1. `micro`: fixed step shapes (a chat-sized prefill chunk that ends its prompt, a one-request
   decode, a small mixed step) run back to back, then again after sleeping 0, 1, 10, 100 and
   1000 ms; the sleeps are interleaved over `--repeats` rounds. Median seconds per (shape,
   sleep) and the ratio to the back-to-back time.
2. `replay`: the fidelity benchmark's light loads (chat and the long-prompt mix at 1 req/s)
   replayed on the real engine in real time. Every step's executor time is divided by what a
   cost model profiled back to back predicts for its shape, and the ratios are binned by the
   idle gap before the step (the wall time since the previous step ended). Per request, its
   TTFT is split into the wait before its first step (arrival to first schedule) and the
   time from its first schedule to its first token, against the simulator on the same
   requests: which part the simulator misses.

    .venv/bin/python benchmarks/idle_gap.py --dtype auto
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
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import build_scheduler_output, profile_model
from heddle.model.step_log import StepRecorder
from heddle.sim.cost_model import StepShape
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.workloads import get_workload

SLEEPS_MS = (0, 1, 10, 100, 1000)
SHAPES = {
    "prefill 96 (ends prompt)": StepShape(((96, 96),), (), num_sampled=1),
    "decode b=1 ctx 200": StepShape((), (200,)),
    "mixed b=2 + chunk 48": StepShape(((48, 48),), (150, 250), num_sampled=3),
}
GAP_EDGES_MS = (0.5, 2.0, 10.0, 100.0)
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": {"length_scale": 0.25},
    "long-prompt-mix": {"length_scale": 0.2, "long_share": 0.1},
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(dtype=args.dtype),
        cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=32),
    )


def micro(executor: ModelExecutor, repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of each shape after each sleep (3 back-to-back warm-up runs first)."""
    vocab = executor.model_shape.vocab_size
    times: dict[str, dict[int, list[float]]] = {n: {s: [] for s in SLEEPS_MS} for n in SHAPES}
    step_id, finished = 0, []

    def run(shape: StepShape) -> float:
        nonlocal step_id, finished
        so = build_scheduler_output(shape, step_id, executor.block_size, executor.num_blocks, vocab)
        so.finished_request_ids = finished
        start = time.perf_counter()
        executor.execute(so)
        elapsed = time.perf_counter() - start
        finished, step_id = list(so.request_ids), step_id + 1
        return elapsed

    for round_ in range(repeats):
        for name, shape in SHAPES.items():
            # Rotate the order of the sleeps each round, so no sleep always follows another.
            order = SLEEPS_MS[round_ % len(SLEEPS_MS):] + SLEEPS_MS[: round_ % len(SLEEPS_MS)]
            for sleep_ms in order:
                for _ in range(3):
                    run(shape)  # back to back: threads spinning, caches warm
                time.sleep(sleep_ms / 1000)
                times[name][sleep_ms].append(run(shape))
    out: dict[str, dict[str, float]] = {}
    for name, by_sleep in times.items():
        base = statistics.median(by_sleep[0])
        out[name] = {f"{s} ms": statistics.median(v) for s, v in by_sleep.items()}
        print(f"{name}: back to back {1000 * base:.2f} ms; after a sleep of " + ", ".join(
            f"{s} ms: {statistics.median(v) / base:.3f}x" for s, v in by_sleep.items() if s))
    return out


def gap_bin(gap_ms: float) -> str:
    low = 0.0
    for edge in GAP_EDGES_MS:
        if gap_ms < edge:
            return f"{low:g}-{edge:g} ms"
        low = edge
    return f">={low:g} ms"


def replay_case(
    config: EngineConfig, executor: ModelExecutor, cost: Any, name: str, rate: float, n: int
) -> dict[str, Any]:
    vocab = executor.model_shape.vocab_size
    workload = get_workload(name, seed=0, num_requests=n, rate=rate, **WORKLOADS[name])
    recorder = StepRecorder(executor)
    engine = Engine(config, recorder, num_blocks=executor.num_blocks, clock=WallClock(),
                    eos_token_id=executor.eos_token_id, max_model_len=executor.max_model_len,
                    vocab_size=vocab)  # fmt: skip
    real = replay(engine, workload, vocab_size=vocab)
    sim_engine = build_sim_engine(config, model=executor.model_shape, cost_model=cost,
                                  num_blocks=executor.num_blocks,
                                  max_model_len=executor.max_model_len)  # fmt: skip
    sim = simulate(workload, sim_engine)
    # Per step: executor seconds / the back-to-back profile's prediction, by the idle gap.
    stats = real.step_stats
    assert len(stats) == len(recorder.steps)
    ratios: dict[str, list[float]] = {}
    outside: list[float] = []  # engine time outside the executor between busy steps
    prev_end = None
    for stat, (shape, seconds) in zip(stats, recorder.steps, strict=True):
        gap_ms = 1e3 * (stat.start_time - prev_end) if prev_end is not None else 1e9
        ratios.setdefault(gap_bin(gap_ms), []).append(seconds / cost.step_time(shape))
        if gap_ms < GAP_EDGES_MS[0]:
            outside.append(gap_ms)
        prev_end = stat.start_time + stat.duration
    by_gap = {b: [len(v), statistics.median(v)] for b, v in sorted(ratios.items())}
    # Per request: TTFT = wait before the first schedule + first schedule to first token.
    sim_by_id = {r.request_id: r for r in sim.records}
    parts: dict[str, list[float]] = {k: [] for k in ("real_wait", "sim_wait", "real_run",
                                                     "sim_run", "real_ttft", "sim_ttft")}
    for r in real.records:
        s = sim_by_id[r.request_id]
        for who, rec in (("real", r), ("sim", s)):
            assert rec.first_scheduled_time is not None and rec.first_token_time is not None
            parts[f"{who}_wait"].append(rec.first_scheduled_time - rec.arrival_time)
            parts[f"{who}_run"].append(rec.first_token_time - rec.first_scheduled_time)
            parts[f"{who}_ttft"].append(rec.first_token_time - rec.arrival_time)
    medians = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
    print(f"\n{name} @ {rate}: {len(stats)} steps; executor time / back-to-back prediction "
          f"by the idle gap before the step:")  # fmt: skip
    for b, (count, ratio) in by_gap.items():
        print(f"  gap {b:12s} {count:5d} steps  median ratio {ratio:.3f}")
    if outside:
        print(f"  engine time between back-to-back steps: median {statistics.median(outside):.3f}"
              f" ms over {len(outside)} gaps")  # fmt: skip
    print("  TTFT medians (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    return {"workload": name, "rate": rate, "by_gap": by_gap, "ttft_parts_ms": medians,
            "between_steps_ms": statistics.median(outside) if outside else None,
            "parts": parts}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--part", choices=("micro", "replay", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of the micro benchmark")
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--workloads", default="chat,long-prompt-mix")
    parser.add_argument("--output", default="results/idle_gap.json")
    args = parser.parse_args()
    config = engine_config(args)
    executor = ModelExecutor(config.model, config.cache)
    print(f"{cpu_model()}; {executor.dtype}, quantization {executor.quantization}")
    results: dict[str, Any] = {"machine": cpu_model(), "dtype": str(executor.dtype)}
    if args.part in ("micro", "both"):
        results["micro"] = micro(executor, args.repeats)
    if args.part in ("replay", "both"):
        cost = profile_model(executor, max_num_batched_tokens=256, max_num_seqs=32,
                             max_context=1024, num_mixed=48, repeats=3)  # fmt: skip
        results["cases"] = [
            replay_case(config, executor, cost, name, args.rate, args.num_requests)
            for name in args.workloads.split(",")
        ]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
