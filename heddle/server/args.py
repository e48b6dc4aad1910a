"""Command-line options of `heddle serve`, for the CLI to add to its subparser.

The CLI calls `add_arguments(subparsers.add_parser("serve"))`, then `run_from_args(args)`.
"""

from __future__ import annotations

import argparse

from heddle.cli.flags import add_engine_arguments, engine_config_from_args
from heddle.errors import HeddleError
from heddle.server.app import DEFAULT_HOST, DEFAULT_PORT, run_server
from heddle.tools import AUTO, FORMATS

__all__ = ["add_arguments", "engine_config_from_args", "run_from_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--served-model-name", default=None, help="name in the `model` field")
    http = parser.add_argument_group("HTTP")
    http.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    http.add_argument("--port", type=int, default=DEFAULT_PORT)
    http.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")
    http.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body")
    http.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests may take to finish after SIGTERM",
    )
    http.add_argument("--log-level", default="info", help="uvicorn's log level")
    parser.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=[AUTO, *FORMATS],
        help="how the model writes tool calls (default: picked from the chat template)",
    )
    from heddle.cluster.args import add_cluster_arguments

    add_cluster_arguments(parser)
    parser.add_argument(
        "--engine-core",
        choices=("process", "thread"),
        default="process",
        help="run the engine core in its own process (default) or in a thread of the server",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """`heddle serve`: returns the exit status. Raises HeddleError for bad options or models."""
    if args.max_body_mb <= 0:
        raise HeddleError("--max-body-mb must be positive")
    if args.replicas != 1 or args.ray_address is not None:
        from heddle.cluster.args import run_cluster_from_args

        return run_cluster_from_args(args, engine_config_from_args(args))
    return run_server(
        engine_config_from_args(args),
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
        tool_call_parser=args.tool_call_parser,
        engine_core=args.engine_core,
    )
