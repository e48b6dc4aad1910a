"""Command-line options of `heddle serve`, for the CLI to add to its subparser.

The CLI calls `add_arguments(subparsers.add_parser("serve"))`, then `run_from_args(args)`.
"""

from __future__ import annotations

import argparse
import ast

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.errors import HeddleError
from heddle.server.app import DEFAULT_HOST, DEFAULT_PORT, run_server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, help="GGUF file or HF dir (default: embedded)")
    model.add_argument("--served-model-name", default=None, help="name in the `model` field")
    model.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    model.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    model.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    model.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    model.add_argument("--seed", type=int, default=0)

    sched = parser.add_argument_group("scheduler and cache")
    sched.add_argument("--policy", default="fcfs", help="scheduling policy by name")
    sched.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the policy (repeatable)",
    )
    sched.add_argument("--max-num-seqs", type=int, default=64, help="cap on running requests")
    sched.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="token budget of one step"
    )
    sched.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="bound on the waiting queue; beyond it requests get HTTP 429 (default: none)",
    )
    sched.add_argument("--long-prefill-token-threshold", type=int, default=None)
    sched.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    sched.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: sized)")
    sched.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    sched.add_argument("--no-prefix-caching", action="store_true")

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


def parse_policy_options(items: list[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise HeddleError(f"--policy-option wants KEY=VALUE, got {item!r}")
        try:
            options[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            options[key] = raw
    return options


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            num_threads=args.num_threads,
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            enable_prefix_caching=not args.no_prefix_caching,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            policy=args.policy,
            policy_options=parse_policy_options(args.policy_option),
            max_waiting=args.max_waiting,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
        ),
        seed=args.seed,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """`heddle serve`: returns the exit status. Raises HeddleError for bad options or models."""
    if args.max_body_mb <= 0:
        raise HeddleError("--max-body-mb must be positive")
    return run_server(
        engine_config_from_args(args),
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
    )
