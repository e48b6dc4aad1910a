"""`heddle serve | generate | bench serve | simulate | profile`.

Errors a user can cause print one line and exit non-zero; they never show a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from heddle.errors import HeddleError


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that runs the real engine (they mirror the config fields)."""
    m = parser.add_argument_group("model")
    m.add_argument(
        "--model",
        default=None,
        help="GGUF file or HF model directory (default: embedded SmolLM2-135M-Instruct)",
    )
    m.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    m.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    m.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    m.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    m.add_argument("--seed", type=int, default=0)
    s = parser.add_argument_group("scheduler and KV cache")
    s.add_argument("--policy", default="fcfs", help="scheduling policy (see `heddle policies`)")
    s.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the policy (repeatable; values parsed as JSON or Python literals)",
    )
    s.add_argument("--max-num-seqs", type=int, default=64, help="cap on running requests")
    s.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="token budget of one step"
    )
    s.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="bound on the waiting queue; beyond it requests are refused (HTTP 429)",
    )
    s.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=None,
        help="longest prefill chunk of one request in a step",
    )
    s.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    s.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help="KV blocks (default: from --kv-cache-memory-gb)",
    )
    s.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    s.add_argument("--no-prefix-caching", action="store_false", dest="enable_prefix_caching")


def parse_policy_options(items: Sequence[str]) -> dict[str, object]:
    """["aging_seconds=0.5", "ttft={'short': 1.0}", "mode=x"] -> typed values (strings kept)."""
    import ast
    import json

    options: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise HeddleError(f"--policy-option wants KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            try:
                options[key] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                options[key] = raw
    return options


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """LLM(...) / build_config(...) keyword arguments from the flags above."""
    return {
        "model": args.model,
        "seed": args.seed,
        "dtype": args.dtype,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "num_threads": args.num_threads,
        "block_size": args.block_size,
        "num_blocks": args.num_blocks,
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "enable_prefix_caching": args.enable_prefix_caching,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "policy": args.policy,
        "policy_options": parse_policy_options(args.policy_option),
        "max_waiting": args.max_waiting,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
    }


# -- generate ---------------------------------------------------------------------------------
def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate from a prompt, streaming tokens to the terminal")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="treat the prompt as a user message")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--sample-seed", type=int, default=None, dest="sample_seed")
    add_engine_arguments(p)
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from heddle.engine.llm import LLM
    from heddle.request import SamplingParams

    llm = LLM(**engine_kwargs(args))  # type: ignore[arg-type]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop=tuple(args.stop),
        seed=args.sample_seed,
    )
    text = args.prompt
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    engine = llm.engine
    engine.add_request("cli", llm.tokenizer.encode(text), params, prompt=text)
    if not args.chat:
        sys.stdout.write(args.prompt)
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            sys.stdout.write(output.outputs[0].delta_text)
            sys.stdout.flush()
            if output.finished:
                final = output
    sys.stdout.write("\n")
    if final is not None and final.metrics is not None:
        record = final.metrics
        n = record.num_output_tokens
        tpot = record.tpot or 0.0
        print(
            f"[{n} tokens, ttft {1000 * (record.ttft or 0):.0f} ms, "
            f"{1 / tpot if tpot else 0:.1f} tok/s, finish: {final.outputs[0].finish_reason}]",
            file=sys.stderr,
        )
    return 0


# -- policies ---------------------------------------------------------------------------------
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
    parser = argparse.ArgumentParser(prog="heddle", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_policies(sub)
    from heddle.cli_commands import register_all

    register_all(sub)
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
