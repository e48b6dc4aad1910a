"""The entry point: one parser with every subcommand. Subcommand modules are imported here and
nowhere else; they import only heddle/cli/flags.py of the CLI.

Errors a user can cause print one line and exit non-zero; they never show a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from heddle.errors import HeddleError

DESCRIPTION = "heddle serve | generate | bench serve | simulate | profile | view | policies"


def _add_serve(p: argparse.ArgumentParser) -> None:
    from heddle.server.args import add_arguments, run_from_args

    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_bench(bench: argparse.ArgumentParser) -> None:
    from heddle.bench.client import add_arguments, run_from_args

    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    p = bench_sub.add_parser(
        "serve",
        help="measure any OpenAI-compatible server (heddle, llama-server, vLLM, ...)",
        description="Send a workload to a server's /v1/completions, streaming, open or closed "
        "loop; report TTFT, TPOT, ITL, E2E per request class, throughput and goodput.",
    )
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_simulate(p: argparse.ArgumentParser) -> None:
    from heddle.sim.cli import add_simulate_arguments, run_simulate

    add_simulate_arguments(p)
    p.set_defaults(func=run_simulate)


def _add_profile(p: argparse.ArgumentParser) -> None:
    from heddle.cli.profile import add_arguments, run_from_args

    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_generate(p: argparse.ArgumentParser) -> None:
    from heddle.cli.generate import add_arguments, run_from_args

    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_view(p: argparse.ArgumentParser) -> None:
    from heddle.view.cli import add_view_arguments, run_view

    add_view_arguments(p)
    p.set_defaults(func=run_view)


def _add_policies(p: argparse.ArgumentParser) -> None:
    p.set_defaults(func=_policies)


def _policies(args: argparse.Namespace) -> int:
    from heddle.core.policies import available_policies
    from heddle.core.policies.registry import policy_class

    for name in available_policies():
        doc = (policy_class(name).__doc__ or "").strip().splitlines()
        print(f"{name:10s} {doc[0] if doc else ''}")
    return 0


# name, help, description, the function that adds the subcommand's arguments (it imports the
# subcommand's module: `heddle simulate` need not import the server's).
_SUBCOMMANDS: tuple[tuple[str, str, str | None, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("generate", "generate from a prompt, streaming tokens to the terminal", None, _add_generate),
    ("policies", "list the scheduling policies", None, _add_policies),
    ("serve", "serve an OpenAI-compatible API (binds 127.0.0.1)", None, _add_serve),
    ("bench", "load-test an OpenAI-compatible server", None, _add_bench),
    (
        "simulate",
        "run the real scheduler on a virtual clock with a cost model",
        "Simulate a workload with the real Engine, Scheduler and policies; only the executor "
        "(a cost model) and the clock are replaced.",
        _add_simulate,
    ),
    ("profile", "measure the real executor and fit a cost model", None, _add_profile),
    ("view", "the dashboard of a saved simulation or bench run", None, _add_view),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only` (a subcommand's name), only that subcommand gets its
    arguments (and its module imported): the others are listed by name and help."""
    parser = argparse.ArgumentParser(prog="heddle", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, description, add in _SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=description)
        if only is None or only == name:
            add(p)
    return parser


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, if it is one (the parser has no options
    of its own but -h, so it is the first word that is not an option)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if any(first == name for name, *_ in _SUBCOMMANDS) else None


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_subcommand(words))
    args = parser.parse_args(words)
    try:
        return int(args.func(args) or 0)
    except HeddleError as exc:
        print(f"heddle: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
