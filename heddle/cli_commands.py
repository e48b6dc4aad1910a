"""Subcommands that live beside their subsystems: serve, bench, simulate, profile."""

from __future__ import annotations

import argparse


def register_all(sub: argparse._SubParsersAction) -> None:
    from heddle.bench.client import add_arguments as add_bench_arguments
    from heddle.bench.client import run_from_args as run_bench
    from heddle.server.args import add_arguments as add_serve_arguments
    from heddle.server.args import run_from_args as run_serve

    p = sub.add_parser("serve", help="serve an OpenAI-compatible API (binds 127.0.0.1)")
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)

    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible server")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    p = bench_sub.add_parser(
        "serve",
        help="measure any OpenAI-compatible server (heddle, llama-server, vLLM, ...)",
        description="Send a workload to a server's /v1/completions, streaming, open or closed "
        "loop; report TTFT, TPOT, ITL, E2E per request class, throughput and goodput.",
    )
    add_bench_arguments(p)
    p.set_defaults(func=run_bench)

    from heddle.sim.cli import (
        add_profile_arguments,
        add_simulate_arguments,
        run_profile,
        run_simulate,
    )

    p = sub.add_parser(
        "simulate",
        help="run the real scheduler on a virtual clock with a cost model",
        description="Simulate a workload with the real Engine, Scheduler and policies; only the "
        "executor (a cost model) and the clock are replaced.",
    )
    add_simulate_arguments(p)
    p.set_defaults(func=run_simulate)

    from heddle.cli import add_engine_arguments

    p = sub.add_parser("profile", help="measure the real executor and fit a cost model")
    add_profile_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(func=run_profile)
