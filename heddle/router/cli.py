"""`heddle simulate --replicas N --router NAME [--fail R@T]`: the multi-replica simulator."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from heddle.errors import HeddleError


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    """The replica/router flags of `heddle simulate`."""
    from heddle.router.registry import available_routers

    g = p.add_argument_group("replicas (several engines behind a router, one virtual clock)")
    g.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="simulate N engine replicas behind a router (default: one engine, no router)",
    )
    g.add_argument(
        "--router",
        default="least-tokens",
        help=f"routing policy: {', '.join(available_routers())}",
    )
    g.add_argument("--router-option", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="R@T[+S]",
        help="replica R dies at T seconds and is back S seconds later (default 10; +never)",
    )


def router_options(items: list[str]) -> dict[str, object]:
    from heddle.cli.flags import parse_key_values

    return parse_key_values(items, "--router-option")


def run_cluster_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from heddle.cli.flags import config_from_args, parse_key_values, parse_slo
    from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
    from heddle.metrics import print_summary, summarize
    from heddle.router.replay import ReplicaFailure
    from heddle.router.simulate import simulate_cluster
    from heddle.sim.simulator import sim_machine
    from heddle.workloads import get_workload

    if args.replicas < 1:
        raise HeddleError("--replicas must be at least 1")
    if args.sweep:
        raise HeddleError("--sweep is not supported with --replicas")
    failures = [ReplicaFailure.parse(spec) for spec in args.fail]
    workload = get_workload(
        args.workload,
        seed=args.seed,
        num_requests=args.num_requests,
        rate=math.inf if args.rate is None else args.rate,
        arrival=args.arrival,
        cv=args.cv,
        **parse_key_values(args.workload_option, "--workload-option"),
    )
    config = EngineConfig(
        cache=config_from_args(CacheConfig, args),
        scheduler=config_from_args(SchedulerConfig, args),
        seed=args.seed,
    )
    machine = sim_machine(
        config, model=args.model, hardware=args.hardware, tp=args.tp, cost_model=args.cost_model
    )
    result = simulate_cluster(
        workload,
        config,
        machine.cost_model,
        num_replicas=args.replicas,
        router=args.router,
        router_options=router_options(args.router_option),
        num_blocks=machine.num_blocks,
        vocab_size=machine.shape.vocab_size,
        max_model_len=args.max_model_len,
        failures=failures,
        seed=args.seed,
    )
    summary = summarize(result.records, slo=parse_slo(args.slo))
    load = f"{args.rate} req/s" if args.rate else "all at once"
    title = (
        f"simulate {args.workload} @ {load} — {args.replicas} replicas, router {args.router}, "
        f"policy {args.policy}, {args.model} on {args.hardware}"
    )
    print_summary(summary, title, console=Console(width=None if sys.stdout.isatty() else 200))
    print(
        f"{len(result.records)} requests, {len(result.rejected)} rejected, "
        f"{result.num_steps} steps, {result.num_resumed} resumed after a failure, "
        f"{result.num_lost_tokens} tokens lost; prefix-cache hit rate "
        f"{100 * result.prefix_hit_rate:.1f}%; {result.elapsed:.1f} s simulated in "
        f"{result.wall_seconds:.1f} s wall"
    )
    elapsed = result.elapsed or 1.0
    for r in result.replicas:
        hit = r.prefix_hits / r.prefix_queries if r.prefix_queries else 0.0
        print(
            f"  replica {r.replica_id:2d}: {r.num_routed:6d} routed, busy "
            f"{100 * r.busy_time / elapsed:5.1f}%, {r.num_preemptions} preemptions, "
            f"prefix hits {100 * hit:5.1f}%"
            + (f", {r.num_failures} failure(s)" if r.num_failures else "")
        )
    if result.rejected:
        print(f"rejected, e.g. {result.rejected[0][0]}: {result.rejected[0][1]}")
    if args.output_dir:
        _write(args, workload, result, summary)
    return 0


def _write(args: argparse.Namespace, workload: Any, result: Any, summary: Any) -> None:
    from heddle.bench.report import _finite
    from heddle.metrics import record_to_dict

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "workload": workload.describe(),
        "summary": summary.to_dict(),
        "router": result.router,
        "prefix_hit_rate": result.prefix_hit_rate,
        "num_resumed": result.num_resumed,
        "num_lost_tokens": result.num_lost_tokens,
        "elapsed": result.elapsed,
        "wall_seconds": result.wall_seconds,
        "rejected": result.rejected,
        "replicas": [
            vars(r) if not hasattr(r, "__slots__") else _slots(r) for r in result.replicas
        ],
        "records": [record_to_dict(r) for r in result.records],
    }
    path = out / f"{args.label}.json"
    path.write_text(json.dumps(_finite(data), indent=1) + "\n")
    print(f"wrote {path}")


def _slots(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}
