"""`heddle simulate` and `heddle profile`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.errors import HeddleError


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    from heddle.workloads import ARRIVAL_PROCESSES, list_workloads

    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload", default="chat", help=f"{', '.join(list_workloads())} or a .jsonl/.csv"
    )
    w.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    w.add_argument("--rate", type=float, default=None, help="requests/s (default: all at once)")
    w.add_argument("--arrival", choices=ARRIVAL_PROCESSES, default=None)
    w.add_argument("--cv", type=float, default=None, help="gamma arrivals: burstiness")
    w.add_argument("--num-requests", type=int, default=1000)
    w.add_argument("--seed", type=int, default=0)
    m = p.add_argument_group("model and hardware")
    m.add_argument("--model", default="llama-3.1-8b", help="model spec id or JSON path")
    m.add_argument("--hardware", default="h100", help="hardware spec id or JSON path")
    m.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    m.add_argument("--cost-model", default=None, help="a profile JSON from `heddle profile`")
    m.add_argument("--max-model-len", type=int, default=None)
    s = p.add_argument_group("scheduler")
    s.add_argument("--policy", default="fcfs")
    s.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--max-num-batched-tokens", type=int, default=8192)
    s.add_argument("--max-num-seqs", type=int, default=256)
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--num-blocks", type=int, default=None, help="default: what fits in memory")
    s.add_argument("--no-prefix-caching", action="store_false", dest="enable_prefix_caching")
    o = p.add_argument_group("report")
    o.add_argument("--slo", default=None, help="goodput targets, e.g. ttft=0.5,tpot=0.05")
    o.add_argument("--output-dir", default=None, help="write JSON and PNGs here")
    o.add_argument("--label", default="simulate")
    o.add_argument("--sweep", default=None, metavar="rate=A:B:N", help="a load sweep")
    o.add_argument("--no-progress", action="store_true")
    from heddle.router.cli import add_replica_arguments

    add_replica_arguments(p)


def _cost_model(args: argparse.Namespace) -> tuple[Any, Any, int]:
    from heddle.sim import (
        ProfiledCostModel,
        RooflineCostModel,
        kv_cache_blocks,
        load_hardware_spec,
        load_model_spec,
    )

    model = load_model_spec(args.model)
    tp = args.tp or model.default_tp
    if args.cost_model:
        path = Path(args.cost_model)
        if not path.is_file():
            raise HeddleError(f"no cost model file at {path}")
        cost: Any = ProfiledCostModel.load(path)
        num_blocks = args.num_blocks
        if num_blocks is None:
            raise HeddleError("with --cost-model, give --num-blocks (the real engine's KV pool)")
    else:
        hardware = load_hardware_spec(args.hardware)
        cost = RooflineCostModel(model, hardware, tp=tp)
        num_blocks = args.num_blocks or kv_cache_blocks(
            model,
            hardware,
            args.block_size,
            tp=tp,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
        )
    return model, cost, num_blocks


def simulate_once(args: argparse.Namespace, rate: float | None, progress: bool) -> tuple[Any, Any]:
    from heddle.bench.client import parse_key_values
    from heddle.cli import parse_policy_options
    from heddle.sim.executor import SimulatedExecutor
    from heddle.sim.simulator import simulate
    from heddle.workloads import get_workload

    model, cost, num_blocks = _cost_model(args)
    workload_kwargs: dict[str, Any] = {
        "seed": args.seed,
        "num_requests": args.num_requests,
        "rate": math.inf if rate is None else rate,
        "arrival": args.arrival,
        "cv": args.cv,
    }
    workload = get_workload(
        args.workload, **workload_kwargs, **parse_key_values(args.workload_option)
    )
    config = EngineConfig(
        cache=CacheConfig(
            block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            policy=args.policy,
            policy_options=parse_policy_options(args.policy_option),
        ),
    )
    vocab = model.vocab_size
    result = simulate(
        workload,
        config,
        lambda clock: SimulatedExecutor(cost, clock, vocab_size=vocab, seed=args.seed),
        num_blocks=num_blocks,
        vocab_size=vocab,
        max_model_len=args.max_model_len,
        progress=progress,
    )
    return workload, result


def run_simulate(args: argparse.Namespace) -> int:
    from heddle.bench.client import parse_slo
    from heddle.metrics import print_summary, summarize

    if getattr(args, "replicas", None) is not None:
        from heddle.router.cli import run_cluster_simulate

        return run_cluster_simulate(args)
    slo = parse_slo(args.slo)
    if args.sweep:
        return _run_sweep(args, slo)
    progress = not args.no_progress and sys.stderr.isatty()
    workload, result = simulate_once(args, args.rate, progress)
    summary = summarize(result.records, slo=slo)
    load = f"{args.rate} req/s" if args.rate else "all at once"
    title = f"simulate {args.workload} @ {load} — {args.policy}, {args.model} on {args.hardware}"
    from rich.console import Console

    # Off a terminal rich assumes 80 columns, too narrow for the table: use a log's width.
    print_summary(summary, title, console=Console(width=None if sys.stdout.isatty() else 200))
    steps = result.step_stats
    batch = [s.num_requests for s in steps]
    kv = [s.kv_blocks_used / s.kv_blocks_total for s in steps]
    util = [s.utilization for s in steps]
    print(
        f"{len(result.records)} requests, {len(result.rejected)} rejected, "
        f"{result.num_steps} steps, {result.num_preemptions} preemptions, "
        f"{result.elapsed:.1f} s simulated in "
        f"{result.wall_seconds:.1f} s wall ({result.requests_per_wall_second:.0f} requests/s)"
    )
    if steps:
        print(
            f"batch size mean {sum(batch) / len(batch):.1f} max {max(batch)}; "
            f"KV blocks ({result.num_blocks}) used mean {100 * sum(kv) / len(kv):.1f}% "
            f"peak {100 * max(kv):.1f}%; "
            f"step utilization (tokens / budget) mean {100 * sum(util) / len(util):.1f}%"
        )
    if result.rejected:
        print(f"rejected, e.g. {result.rejected[0][0]}: {result.rejected[0][1]}")
    if args.output_dir:
        _write_outputs(args, workload, result, summary)
    return 0


def _write_outputs(args: argparse.Namespace, workload: Any, result: Any, summary: Any) -> None:
    from heddle.bench.report import _finite
    from heddle.metrics import plot_latency_cdfs, plot_timeline, record_to_dict

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "workload": workload.describe(),
        "summary": summary.to_dict(),
        "num_steps": result.num_steps,
        "num_preemptions": result.num_preemptions,
        "elapsed": result.elapsed,
        "wall_seconds": result.wall_seconds,
        "rejected": result.rejected,
        "records": [record_to_dict(r) for r in result.records],
    }
    (out / f"{args.label}.json").write_text(json.dumps(_finite(data), indent=1) + "\n")
    plot_latency_cdfs({args.label: result.records}, out / f"{args.label}_cdf.png", title=args.label)
    plot_timeline(result.step_stats, out / f"{args.label}_timeline.png", title=args.label)
    print(f"wrote {out / args.label}.json, {args.label}_cdf.png, {args.label}_timeline.png")


def _run_sweep(args: argparse.Namespace, slo: Any) -> int:
    from heddle.metrics import SweepPoint, plot_sweep, summarize

    key, _, spec = args.sweep.partition("=")
    parts = spec.split(":")
    if key != "rate" or len(parts) != 3:
        raise HeddleError(f"--sweep wants rate=START:STOP:COUNT, got {args.sweep!r}")
    try:
        start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise HeddleError(f"--sweep wants numbers, got {args.sweep!r}") from None
    if count < 1 or start <= 0 or stop < start:
        raise HeddleError("--sweep wants 0 < START <= STOP and COUNT >= 1")
    rates = [start + (stop - start) * i / max(1, count - 1) for i in range(count)]
    points = []
    print(
        f"{'rate':>8} {'req/s':>8} {'out tok/s':>10} {'p99 TTFT':>9} {'p99 TPOT':>9} {'goodput':>8}"
    )
    for rate in rates:
        _, result = simulate_once(args, rate, progress=False)
        summary = summarize(result.records, slo=slo)
        point = SweepPoint.from_summary(args.policy, rate, summary)
        points.append(point)
        o = summary.overall
        goodput = "-" if o.goodput is None else f"{o.goodput:.2f}"
        print(
            f"{rate:8.2f} {o.request_throughput:8.2f} {o.output_throughput:10.1f} "
            f"{o.ttft.p99:9.3f} {o.tpot.p99:9.4f} {goodput:>8}"
        )
    if args.output_dir:
        path = plot_sweep(
            points, Path(args.output_dir) / f"{args.label}_sweep.png", title=args.label
        )
        print(f"wrote {path}")
    return 0


# -- profile ----------------------------------------------------------------------------------
def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="profile.json", help="where to write the fitted model")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-context", type=int, default=2048)


def run_profile(args: argparse.Namespace) -> int:
    import platform

    from heddle.model.executor import ModelExecutor
    from heddle.sim import fit_profile, profile_executor, profile_grid

    config_model, config_cache = _profile_configs(args)
    executor = ModelExecutor(config_model, config_cache)
    shapes = profile_grid(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_context=args.max_context,
        max_kv_tokens=executor.num_blocks * executor.block_size,
    )
    print(
        f"profiling {len(shapes)} step shapes x {args.repeats} "
        f"on {executor.model_name} ({executor.dtype})"
    )
    samples = profile_executor(
        executor.execute,
        shapes,
        executor.block_size,
        repeats=args.repeats,
        num_blocks=executor.num_blocks,
        vocab_size=executor.model_shape.vocab_size,
    )
    fitted = fit_profile(
        samples,
        model=executor.model_name,
        dtype=str(executor.dtype),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        extra={"num_blocks": executor.num_blocks, "block_size": executor.block_size},
    )
    fitted.save(args.output)
    fit = fitted.metadata.fit
    if fit is not None:
        print(
            f"fit over {fit.num_samples} samples: "
            f"median |error| {100 * fit.median_abs_relative_error:.1f}%, "
            f"max {100 * fit.max_abs_relative_error:.1f}%"
        )
    print(f"wrote {args.output}")
    return 0


def _profile_configs(args: argparse.Namespace) -> tuple[Any, Any]:
    from heddle.cli import engine_kwargs
    from heddle.engine.llm import build_config

    config = build_config(**engine_kwargs(args))  # type: ignore[arg-type]
    return config.model, config.cache
