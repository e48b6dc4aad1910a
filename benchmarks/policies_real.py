"""The real-engine side of the policy experiments (not a script; see benchmarks/policies.py).

Every policy but `oracle` on the real CPU engine (the embedded SmolLM2-135M, one ModelExecutor
shared by all runs) on the simulator's four workloads scaled down to fit two cores: outputs of
16-128 tokens (reasoning 10-50x its short answers), long prompts of ~1,000 tokens. Arrivals are
replayed in real time by the same event loop as the simulator (heddle.engine.replay) on a wall
clock. As in the simulator, load is a fraction of fcfs's saturation throughput, measured first
on this machine (all requests queued at once). Run it on a quiet machine: the numbers are wall
time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from policies_setup import (
    POLICIES,
    SIM_ONLY,
    ClassSpec,
    WorkloadSpec,
    run_metrics,
    saturation_throughput,
)

# CPU-scale SLOs: a decode step of ~32 sequences takes tens of milliseconds on two cores.
CPU_INTERACTIVE = ClassSpec(ttft=2.0, tpot=0.25)
CPU_BATCHY = ClassSpec(ttft=8.0, tpot=0.5, priority=1)
# Token thresholds of the GPU-scale defaults, scaled with the workloads' lengths (~0.25x).
SCALED = {
    "lanes": {"long_prompt_tokens": 512, "long_output_tokens": 256},
    "mlfq": {"quantum": 4, "prompt_quantum": 128},
    "sjf": {"default_output_len": 32.0},
    "adaptive": {"target_tpot": 0.2},
}
REAL_WORKLOADS: dict[str, WorkloadSpec] = {
    "chat": WorkloadSpec(
        "chat",
        "chat",
        {"length_scale": 0.25, "max_output_len": 128, "max_prompt_len": 512},
        {"*": CPU_INTERACTIVE},
        ("default",),
        64,
        math.inf,
        64,
        SCALED,
    ),
    "long-prompt": WorkloadSpec(
        "long-prompt",
        "long-prompt-mix",
        {"length_scale": 0.3, "max_output_len": 128, "max_prompt_len": 512},
        {"short": CPU_INTERACTIVE, "long": CPU_BATCHY},
        ("short",),
        64,
        math.inf,
        64,
        SCALED,
    ),
    "reasoning": WorkloadSpec(
        "reasoning",
        "reasoning-mix",
        {"length_scale": 0.2, "max_output_len": 800},
        {"short": CPU_INTERACTIVE, "reasoning": CPU_BATCHY},
        ("short",),
        64,
        math.inf,
        64,
        SCALED,
    ),
    "multi-tenant": WorkloadSpec(
        "multi-tenant",
        "multi-tenant",
        {"length_scale": 0.25, "max_output_len": 128, "max_prompt_len": 512},
        {"*": CPU_INTERACTIVE},
        ("user-1", "user-2", "user-3"),
        64,
        math.inf,
        64,
        SCALED,
    ),
}


def add_real_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default=",".join(REAL_WORKLOADS))
    p.add_argument("--policies", default=",".join(p for p in POLICIES if p not in SIM_ONLY))
    p.add_argument("--loads", default="0.7,1.2", help="fractions of fcfs saturation")
    p.add_argument("--num-requests", type=int, default=None, help="default: per workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--output", type=Path, default=Path("results/policies_real.json"))


class RealBench:
    """One ModelExecutor; a fresh Engine (and policy) per run."""

    def __init__(self, args: argparse.Namespace) -> None:
        from heddle.config import CacheConfig, ModelConfig
        from heddle.model.executor import ModelExecutor

        self.args = args
        self.model_config = ModelConfig(dtype=args.dtype)
        self.cache_config = CacheConfig(block_size=16, kv_cache_memory_gb=0.5)
        self.executor = ModelExecutor(self.model_config, self.cache_config)
        self.vocab = self.executor.arch.vocab_size

    def run(self, key: str, policy: str, rate: float, probe: bool = False) -> dict[str, Any]:
        from heddle.clock import WallClock
        from heddle.config import EngineConfig, SchedulerConfig
        from heddle.engine.engine import Engine
        from heddle.engine.replay import replay

        spec = REAL_WORKLOADS[key]
        args = self.args
        workload = spec.make(args.seed, rate, args.num_requests)
        options = dict(spec.tuning.get(policy, {}))
        config = EngineConfig(
            model=self.model_config,
            cache=self.cache_config,
            scheduler=SchedulerConfig(
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_num_seqs=args.max_num_seqs,
                policy=policy,
                policy_options=options,
            ),
        )
        ex = self.executor
        engine = Engine(
            config,
            ex,
            num_blocks=ex.num_blocks,
            clock=WallClock(),
            eos_token_id=ex.eos_token_id,
            max_model_len=ex.max_model_len,
            vocab_size=self.vocab,
        )
        result = replay(engine, workload, vocab_size=self.vocab)
        out: dict[str, Any] = {
            "point": {
                "workload": key,
                "policy": policy,
                "rate": rate,
                "seed": args.seed,
                "num_requests": len(workload.requests),
                "tag": "real",
            },
            "options": options,
            "elapsed": result.elapsed,
            "num_rejected": len(result.rejected),
        }
        if probe:
            mean_output = sum(r.output_len for r in workload.requests) / len(workload.requests)
            out["saturation"] = saturation_throughput(
                result.records, result.step_stats, mean_output
            )
        else:
            out["metrics"] = run_metrics(
                result.records, result.step_stats, spec.short_classes, engine.scheduler.policy
            )
        return out


def run_real(args: argparse.Namespace) -> None:
    import platform

    keys = [k for k in args.workloads.split(",") if k]
    policies = [p for p in args.policies.split(",") if p and p not in SIM_ONLY]
    loads = [float(x) for x in args.loads.split(",") if x]
    started = time.perf_counter()
    bench = RealBench(args)
    data: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "engine": {
            "dtype": str(bench.executor.dtype),
            "model": bench.executor.model_name,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,
        },
        "capacity": [],
        "points": [],
    }
    for key in keys:
        probe = bench.run(key, "fcfs", math.inf, probe=True)
        data["capacity"].append(probe)
        saturation = probe["saturation"]["requests_per_s"]
        print(f"{key}: fcfs saturation {saturation:.2f} req/s ({probe['elapsed']:.0f} s)")
        for load in loads:
            for policy in policies:
                point = bench.run(key, policy, load * saturation)
                point["point"]["load"] = load
                data["points"].append(point)
                m = point["metrics"]
                print(
                    f"  {policy:<8} load {load:g}: short p99 TTFT "
                    f"{(m['short'] or m['overall'])['ttft']['p99']:.2f} s, goodput "
                    f"{m['overall']['goodput']:.2f} req/s, {point['elapsed']:.0f} s"
                )
        args.output.parent.mkdir(parents=True, exist_ok=True)
        data["wall_seconds"] = time.perf_counter() - started
        args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.output} ({time.perf_counter() - started:.0f} s)")
