"""`heddle simulate`: a workload through the real scheduler on a virtual clock.

The engine comes from `build_sim_engine` (heddle/sim/simulator.py), the scheduler and KV cache
flags from the config dataclasses (heddle/cli/flags.py), with the simulator's GPU-scale defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from heddle.cli.flags import add_config_arguments, config_from_args, parse_key_values, parse_slo
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.errors import HeddleError

# A GPU-sized engine by default (the real engine's defaults suit two CPU cores).
# Decision events only where something reads them: the view's recording (--output-dir) does;
# a run that only prints its summary does not, and would pay their cost on every step.
SIM_DEFAULTS = {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "decision_events": None}
_EVENTS_DEFAULT = SchedulerConfig().decision_events
SIM_SCHEDULER_HELP = {
    "decision_events": "ring buffer of the scheduler's decision events; default: "
    f"{_EVENTS_DEFAULT:,} with --output-dir (the view's recording reads them), "
    "off without; 0 turns them off",
}
SIM_HELP = {
    "num_blocks": "default: what fits in memory",
    "max_waiting": "bound on the waiting queue; beyond it requests are rejected",
}


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    from heddle.workloads import ARRIVAL_PROCESSES, list_workloads
    from heddle.workloads.arrivals import arrival_arg

    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload", default="chat", help=f"{', '.join(list_workloads())} or a .jsonl/.csv"
    )
    w.add_argument(
        "--workload-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the workload generator, e.g. length_scale=0.5 (repeatable)",
    )
    w.add_argument("--rate", type=float, default=None, help="requests/s (default: all at once)")
    w.add_argument(
        "--arrival",
        type=arrival_arg,
        default=None,
        help=f"{', '.join(ARRIVAL_PROCESSES)}; profiles take options: burst:peak=3,calm=0.7",
    )
    w.add_argument("--cv", type=float, default=None, help="gamma arrivals: burstiness")
    w.add_argument("--num-requests", type=int, default=1000)
    w.add_argument("--seed", type=int, default=0)
    m = p.add_argument_group("model and hardware")
    m.add_argument("--model", default="llama-3.1-8b", help="model spec id or JSON path")
    m.add_argument("--hardware", default="h100", help="hardware spec id or JSON path")
    m.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    m.add_argument("--cost-model", default=None, help="a profile JSON from `heddle profile`")
    m.add_argument("--max-model-len", type=int, default=None)
    s = p.add_argument_group("scheduler and KV cache")
    add_config_arguments(s, SchedulerConfig, defaults=SIM_DEFAULTS, helps=SIM_SCHEDULER_HELP)
    # The KV pool is sized from the hardware's memory (or --num-blocks), not a memory budget.
    add_config_arguments(
        s,
        CacheConfig,
        defaults={"block_hash": "builtin"},
        helps=SIM_HELP,
        exclude={"kv_cache_memory_gb"},
    )
    o = p.add_argument_group("report")
    o.add_argument("--slo", default=None, help="goodput targets, e.g. ttft=0.5,tpot=0.05")
    o.add_argument("--output-dir", default=None, help="write JSON and PNGs here")
    o.add_argument("--label", default="simulate")
    o.add_argument("--sweep", default=None, metavar="rate=A:B:N", help="a load sweep")
    o.add_argument("--no-progress", action="store_true")
    from heddle.router.cli import add_replica_arguments

    add_replica_arguments(p)


def simulate_once(
    args: argparse.Namespace, rate: float | None, progress: bool, recorder: Any = None
) -> tuple[Any, Any]:
    """One simulated run; `recorder` (a heddle.view ViewRecorder) watches its steps."""
    from heddle.sim.simulator import simulate

    workload, engine = build_once(args, rate)
    if recorder is not None:
        recorder.attach(engine)
    return workload, simulate(workload, engine, progress=progress)


def build_once(args: argparse.Namespace, rate: float | None) -> tuple[Any, Any]:
    """The workload and the simulated engine of one run of `heddle simulate` with `args`."""
    from heddle.sim.simulator import build_sim_engine
    from heddle.workloads import get_workload

    workload = get_workload(
        args.workload,
        seed=args.seed,
        num_requests=args.num_requests,
        rate=math.inf if rate is None else rate,
        arrival=args.arrival,
        cv=args.cv,
        **parse_key_values(args.workload_option, "--workload-option"),
    )
    scheduler = config_from_args(SchedulerConfig, args)
    if getattr(args, "decision_events", None) is None and not getattr(args, "output_dir", None):
        scheduler = dataclasses.replace(scheduler, decision_events=0)  # nothing would read them
    slo = parse_slo(args.slo)
    if scheduler.admission == "slo" and slo is not None and slo.ttft is not None:
        # Requests without a TTFT target of their own are held to the report's.
        options = {"ttft_slo": slo.ttft, **scheduler.admission_options}
        scheduler = dataclasses.replace(scheduler, admission_options=options)
    config = EngineConfig(
        cache=config_from_args(CacheConfig, args), scheduler=scheduler, seed=args.seed
    )
    engine = build_sim_engine(
        config,
        model=args.model,
        hardware=args.hardware,
        tp=args.tp,
        cost_model=args.cost_model,
        max_model_len=args.max_model_len,
    )
    return workload, engine


def run_simulate(args: argparse.Namespace) -> int:
    from heddle.metrics import print_summary, summarize

    if getattr(args, "replicas", None) is not None:
        from heddle.router.cli import run_cluster_simulate

        return run_cluster_simulate(args)
    slo = parse_slo(args.slo)
    if args.sweep:
        return _run_sweep(args, slo)
    progress = not args.no_progress and sys.stderr.isatty()
    load = f"{args.rate} req/s" if args.rate else "all at once"
    title = f"simulate {args.workload} @ {load} — {args.policy}, {args.model} on {args.hardware}"
    recorder = None
    if args.output_dir:
        from heddle.view.record import ViewRecorder

        recorder = ViewRecorder(title, slo=slo, info={"command": "simulate", "label": args.label})
    workload, result = simulate_once(args, args.rate, progress, recorder)
    summary = summarize(result.records, slo=slo)
    from rich.console import Console

    # Off a terminal rich assumes 80 columns, too narrow for the table: use a log's width.
    print_summary(summary, title, console=Console(width=None if sys.stdout.isatty() else 200))
    steps = result.step_stats
    print(
        f"{len(result.records)} requests, {len(result.rejected)} rejected, "
        f"{result.num_steps} steps, {result.num_preemptions} preemptions, "
        f"{result.elapsed:.1f} s simulated in "
        f"{result.wall_seconds:.1f} s wall ({result.requests_per_wall_second:.0f} requests/s)"
    )
    if steps:
        print(_step_summary(steps, result.num_blocks))
    if result.rejected:
        print(f"rejected, e.g. {result.rejected[0][0]}: {result.rejected[0][1]}")
    speculator = result.engine.scheduler.speculator if result.engine is not None else None
    if speculator is not None:
        drafted, accepted = speculator.acceptance.num_drafted, speculator.acceptance.num_accepted
        print(f"speculation: {drafted} draft tokens, {accepted} accepted "
              f"({100 * accepted / max(drafted, 1):.1f}%), in {speculator.num_steps_with_drafts} "
              "steps")
    _print_overload(args, result)
    _warn_outside_profile(result)
    if result.programs:
        from heddle.metrics.programs import format_program_summary, summarize_programs

        print(format_program_summary(summarize_programs(result.programs, result.records)))
    if args.output_dir:
        _write_outputs(args, workload, result, summary)
    if recorder is not None:
        view = recorder.save(Path(args.output_dir) / f"{args.label}.view.json.gz", result.records)
        print(f"wrote {view}: open it with `heddle view {Path(args.output_dir) / args.label}.json`")
    return 0


def _step_summary(steps: Any, num_blocks: int) -> str:
    """Batch size, KV use and step utilization over the run's steps (a StepLog's columns)."""
    batch = steps.column("num_requests")
    used, total = steps.column("kv_blocks_used"), steps.column("kv_blocks_total")
    kv = [u / t for u, t in zip(used, total, strict=True)]
    tokens = map(int.__add__, steps.column("num_prefill_tokens"), steps.column("num_decode_tokens"))
    util = [n / b if b else 0.0 for n, b in zip(tokens, steps.column("token_budget"), strict=True)]
    return (
        f"batch size mean {sum(batch) / len(batch):.1f} max {max(batch)}; "
        f"KV blocks ({num_blocks}) used mean {100 * sum(kv) / len(kv):.1f}% "
        f"peak {100 * max(kv):.1f}%; "
        f"step utilization (tokens / budget) mean {100 * sum(util) / len(util):.1f}%"
    )


def _print_overload(args: argparse.Namespace, result: Any) -> None:
    """What the preemption guard refused and what admission control shed, per class."""
    if result.engine is None:
        return
    scheduler = result.engine.scheduler
    guard = scheduler.preemption_guard.report()
    refused = ", ".join(f"{k} {v}" for k, v in guard["refused"].items())
    lost, computed = guard["lost_tokens"], guard["computed_tokens"]
    print(
        f"preemption guard (max recompute ratio {args.max_recompute_ratio}): refused "
        f"{refused}; {lost} tokens thrown away by preemption, "
        f"{lost / max(1, computed):.3f} per computed"
    )
    if args.admission == "off":
        return
    for cls, stats in scheduler.admission.report().items():
        reasons = ", ".join(f"{k} {v}" for k, v in stats["refused_by_reason"].items())
        print(
            f"admission {args.admission}, class {cls}: {stats['offered']} offered, "
            f"{stats['refused']} refused ({100 * stats['refused_share']:.1f}%"
            f"{'; ' + reasons if reasons else ''})"
        )


def _warn_outside_profile(result: Any) -> None:
    """A profiled cost model counts the steps it predicted outside what it measured."""
    engine = getattr(result, "engine", None)
    cost_model = getattr(getattr(engine, "executor", None), "cost_model", None)
    warning = getattr(cost_model, "coverage_warning", lambda: None)()
    if warning:
        print(warning, file=sys.stderr)


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
        data_path = Path(args.output_dir) / f"{args.label}_sweep.json"
        from heddle.bench.report import _finite

        sweep = {"points": [p.to_dict() for p in points], "config": {"policy": args.policy}}
        data_path.write_text(json.dumps(_finite(sweep), indent=1) + "\n")
        print(f"wrote {path} and {data_path}")
    return 0
