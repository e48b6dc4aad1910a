"""The real-engine side of the policy study.

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
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from heddle.cli.flags import parse_key_values

from .metrics import run_metrics, saturation_throughput
from .report import write_real_report
from .spec import POLICIES, SIM_ONLY, ClassSpec, WorkloadSpec, policy_options

# CPU-scale SLOs: a decode step of ~32 sequences takes tens of milliseconds on two cores.
CPU_INTERACTIVE = ClassSpec(ttft=2.0, tpot=0.25)
CPU_BATCHY = ClassSpec(ttft=8.0, tpot=0.5, priority=1)
# Token thresholds of the GPU-scale defaults, scaled with the workloads' lengths (~0.25x).
SCALED = {
    "lanes": {"long_prompt_tokens": 512, "long_output_tokens": 256},
    # Recompute is dear on two cores (256-token budget, small KV cache): without a bound, mlfq's
    # newcomers evict the same demoted requests again and again under overload.
    "mlfq": {"quantum": 4, "prompt_quantum": 128, "max_preemptions": 1},
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
        96,
        math.inf,
        96,
        SCALED,
    ),
    "long-prompt": WorkloadSpec(
        "long-prompt",
        "long-prompt-mix",
        {"length_scale": 0.3, "max_output_len": 128, "max_prompt_len": 512},
        {"short": CPU_INTERACTIVE, "long": CPU_BATCHY},
        ("short",),
        96,
        math.inf,
        96,
        SCALED,
    ),
    # Twice the requests: with 96, too few reasoning requests (15%) arrive for them to fill the
    # 16 seats, and short requests barely queue under any policy.
    "reasoning": WorkloadSpec(
        "reasoning",
        "reasoning-mix",
        {"length_scale": 0.2, "max_output_len": 800},
        {"short": CPU_INTERACTIVE, "reasoning": CPU_BATCHY},
        ("short",),
        192,
        math.inf,
        192,
        SCALED,
    ),
    "multi-tenant": WorkloadSpec(
        "multi-tenant",
        "multi-tenant",
        {"length_scale": 0.25, "max_output_len": 128, "max_prompt_len": 512},
        {"*": CPU_INTERACTIVE},
        ("user-1", "user-2", "user-3"),
        96,
        math.inf,
        96,
        SCALED,
    ),
}


def add_real_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default=",".join(REAL_WORKLOADS))
    p.add_argument("--policies", default=",".join(p for p in POLICIES if p not in SIM_ONLY))
    p.add_argument("--loads", default="0.7,1.5", help="fractions of fcfs saturation")
    p.add_argument("--num-requests", type=int, default=None, help="default: per workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    # 16 seats and ~100 requests: enough arrivals per seat for the long requests to pile up as
    # they do in steady state (the simulator needed ~15 per seat for reasoning-mix).
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--output", type=Path, default=None, help="default: results/policies_real.json")
    p.add_argument(
        "--plots",
        type=Path,
        default=None,
        help="default: results/policies/real (with --predict: results/policies_real_predicted); "
        "the figures in docs/ are written by `--plots docs/policies/real`",
    )
    p.add_argument(
        "--predict",
        action="store_true",
        help="simulate the plan instead (no model, no wall clock) to estimate its runtime",
    )
    p.add_argument("--cost-model", default=None, help="with --predict: a `heddle profile` JSON")
    p.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="override a policy option (VALUE as JSON: 1, 0.5, null), e.g. mlfq.max_preemptions=null",
    )


class RealBench:
    """One ModelExecutor; a fresh Engine (and policy) per run. With `--predict`, a simulated
    executor (a cost model on a virtual clock) stands in for the model: the same plan, to
    estimate how long the real runs take."""

    def __init__(self, args: argparse.Namespace) -> None:
        from heddle.config import CacheConfig, ModelConfig

        self.args = args
        self.model_config = ModelConfig(dtype=args.dtype)
        self.cache_config = CacheConfig(block_size=16, kv_cache_memory_gb=0.5)
        self.cost: Any = None
        self.overrides: dict[str, dict[str, Any]] = {}
        for item in args.policy_option:
            policy, dot, key_value = item.partition(".")
            if not (policy and dot):
                raise SystemExit(f"--policy-option wants POLICY.KEY=VALUE, got {item!r}")
            self.overrides.setdefault(policy, {}).update(
                parse_key_values([key_value], "--policy-option")
            )
        if args.predict:
            self._simulated()
        else:
            from heddle.model.executor import ModelExecutor

            ex = ModelExecutor(self.model_config, self.cache_config)
            self.executor, self.num_blocks = ex, ex.num_blocks
            self.vocab = ex.model_shape.vocab_size
            self.eos_token_id, self.max_model_len = ex.eos_token_id, ex.max_model_len
            self.describe = f"{ex.model_name} ({ex.dtype})"

    def _simulated(self) -> None:
        from heddle.sim import ProfiledCostModel, RooflineCostModel, load_model_spec

        # What the real engine would run: the embedded model in fp32, its KV pool from the
        # same memory budget.
        self.shape = replace(load_model_spec("smollm2-135m"), dtype="float32")
        if self.args.cost_model:
            self.cost = ProfiledCostModel.load(self.args.cost_model)
        else:  # a lower bound: small CPU matmuls reach far less than the roofline's peaks
            self.cost = RooflineCostModel(self.shape, "cpu-2core")
        gb, block_size = self.cache_config.kv_cache_memory_gb, self.cache_config.block_size
        self.num_blocks = self.shape.kv_blocks_in(gb * (1 << 30), block_size)
        self.vocab = self.shape.vocab_size
        self.describe = f"predicted by {self.cost.describe()}"

    def _engine(self, config: Any) -> Any:
        from heddle.clock import WallClock
        from heddle.engine.engine import Engine
        from heddle.sim.simulator import build_sim_engine

        if self.cost is not None:
            return build_sim_engine(
                config,
                model=self.shape,
                cost_model=self.cost,
                num_blocks=self.num_blocks,
                max_model_len=8192,
            )
        return Engine(
            config,
            self.executor,
            num_blocks=self.num_blocks,
            clock=WallClock(),
            eos_token_id=self.eos_token_id,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab,
        )

    def run(self, key: str, policy: str, rate: float, probe: bool = False) -> dict[str, Any]:
        from heddle.config import EngineConfig, SchedulerConfig
        from heddle.engine.replay import replay

        spec = REAL_WORKLOADS[key]
        args = self.args
        workload = spec.make(args.seed, rate, args.num_requests)
        options = {**policy_options(policy, spec), **self.overrides.get(policy, {})}
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
        engine = self._engine(config)
        result = replay(engine, workload, vocab_size=self.vocab)
        out: dict[str, Any] = {
            "point": {
                "workload": key,
                "policy": policy,
                "rate": rate,
                "seed": args.seed,
                "num_requests": len(workload.requests),
                "load": 0.0,
                "tag": "",
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
    output = args.output or Path(
        "results/policies_real_predicted.json" if args.predict else "results/policies_real.json"
    )
    started = time.perf_counter()
    bench = RealBench(args)
    data: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "engine": {
            "model": bench.describe,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,
        },
        "command": " ".join(sys.argv),
        "capacity": [],
        "points": [],
    }
    for key in keys:
        # Saturation: every request queued at t=0. static only for Orca's comparison: at the
        # loads of the sweep it could not keep up and would run for hours.
        for policy in ("fcfs", "static"):
            if policy == "fcfs" or (policy in policies and key in ("chat", "reasoning")):
                data["capacity"].append(bench.run(key, policy, math.inf, probe=True))
                c = data["capacity"][-1]
                print(f"{key}: {policy} saturation {c['saturation']['requests_per_s']:.2f} req/s "
                      f"({c['elapsed']:.0f} s)", flush=True)  # fmt: skip
        fcfs = next(c for c in data["capacity"] if c["point"]["workload"] == key)
        for load in loads:
            for policy in (p for p in policies if p != "static"):
                point = bench.run(key, policy, load * fcfs["saturation"]["requests_per_s"])
                point["point"]["load"] = load
                data["points"].append(point)
                m = point["metrics"]
                print(
                    f"  {policy:<8} load {load:g}: short p99 TTFT "
                    f"{(m['short'] or m['overall'])['ttft']['p99']:.2f} s, goodput "
                    f"{m['overall']['goodput']:.2f} req/s, {point['elapsed']:.0f} s",
                    flush=True,
                )
        data["wall_seconds"] = time.perf_counter() - started
        data["engine_seconds"] = sum(r["elapsed"] for r in data["capacity"] + data["points"])
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {output}: {data['engine_seconds']:.0f} s of engine time")
    plots = args.plots or Path(
        "results/policies_real_predicted" if args.predict else "results/policies/real"
    )
    write_real_report(data, output.with_suffix(".md"), plots)
