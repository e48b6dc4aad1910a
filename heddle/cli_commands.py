"""Subcommands that live beside their subsystems: serve, bench, simulate, profile."""

from __future__ import annotations

import argparse


def register_all(sub: argparse._SubParsersAction) -> None:
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
