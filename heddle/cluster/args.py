"""The `heddle serve` flags for replicas (the CLI adds them; `--replicas 1` keeps one engine)."""

from __future__ import annotations

import argparse

from heddle.config import EngineConfig
from heddle.errors import HeddleError


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("replicas (Ray)")
    g.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine replicas behind one front end (default 1: one engine in-process, no Ray)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (default: start a local Ray on 127.0.0.1, stop it on exit)",
    )
    g.add_argument("--router", default="affinity", help="routing policy across the replicas")
    g.add_argument("--router-option", action="append", default=[], metavar="KEY=VALUE")


def run_cluster_from_args(args: argparse.Namespace, config: EngineConfig) -> int:
    from heddle.cluster.serve import run_cluster_server
    from heddle.router.cli import router_options
    from heddle.router.registry import router_policy_class

    if args.replicas < 1:
        raise HeddleError("--replicas must be at least 1")
    router_policy_class(args.router)  # a bad name fails before Ray starts
    return run_cluster_server(
        config,
        args.replicas,
        host=args.host,
        port=args.port,
        ray_address=args.ray_address,
        router=args.router,
        router_options=router_options(args.router_option),
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
    )
