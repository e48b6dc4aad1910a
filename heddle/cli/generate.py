"""`heddle generate`: one prompt through the real engine, tokens streamed to the terminal."""

from __future__ import annotations

import argparse
import sys

from heddle.cli.flags import add_engine_arguments, engine_config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run_from_args(args: argparse.Namespace) -> int:
    from heddle.engine.engine import Engine
    from heddle.engine.llm import LLM
    from heddle.request import SamplingParams

    llm = LLM.from_engine(Engine.from_config(engine_config_from_args(args)))
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
