"""The entry point: one parser with every subcommand. Subcommand modules are imported here and
nowhere else; they import only heddle/cli/flags.py of the CLI.

Errors a user can cause print one line and exit non-zero; they never show a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from heddle.errors import HeddleError

DESCRIPTION = "heddle serve | generate | bench serve | simulate | profile | view | policies"


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from heddle.server.args import add_arguments, run_from_args

    p = sub.add_parser("serve", help="serve an OpenAI-compatible API (binds 127.0.0.1)")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from heddle.bench.client import add_arguments, run_from_args

    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible server")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    p = bench_sub.add_parser(
        "serve",
        help="measure any OpenAI-compatible server (heddle, llama-server, vLLM, ...)",
        description="Send a workload to a server's /v1/completions, streaming, open or closed "
        "loop; report TTFT, TPOT, ITL, E2E per request class, throughput and goodput.",
    )
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    from heddle.sim.cli import add_simulate_arguments, run_simulate

    p = sub.add_parser(
        "simulate",
        help="run the real scheduler on a virtual clock with a cost model",
        description="Simulate a workload with the real Engine, Scheduler and policies; only the "
        "executor (a cost model) and the clock are replaced.",
    )
    add_simulate_arguments(p)
    p.set_defaults(func=run_simulate)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    from heddle.cli.profile import add_arguments, run_from_args

    p = sub.add_parser("profile", help="measure the real executor and fit a cost model")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    from heddle.cli.generate import add_arguments, run_from_args

    p = sub.add_parser("generate", help="generate from a prompt, streaming tokens to the terminal")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_view(sub: argparse._SubParsersAction) -> None:
    from heddle.view.cli import add_view_arguments, run_view

    p = sub.add_parser("view", help="the dashboard of a saved simulation or bench run")
    add_view_arguments(p)
    p.set_defaults(func=run_view)


def _add_policies(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policies", help="list the scheduling policies")
    p.set_defaults(func=_policies)


def _policies(args: argparse.Namespace) -> int:
    from heddle.core.policies import available_policies
    from heddle.core.policies.registry import policy_class

    for name in available_policies():
        doc = (policy_class(name).__doc__ or "").strip().splitlines()
        print(f"{name:10s} {doc[0] if doc else ''}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heddle", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_generate,
        _add_policies,
        _add_serve,
        _add_bench,
        _add_simulate,
        _add_profile,
        _add_view,
    ):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeddleError as exc:
        print(f"heddle: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
