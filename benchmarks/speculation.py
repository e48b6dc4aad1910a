"""Speculative decoding, off vs fixed K vs adaptive K, at 1 .. 64 concurrent streams.

Closed loop: `streams` requests are in flight at all times; each finished one is replaced by
the next, until `requests` have finished. Reported: output tokens per second over the run
(median of `--repeats` runs for the real engine), the acceptance rate and drafts per step.

    # the real CPU engine (embedded SmolLM2-135M), greedy, prompt lookup:
    .venv/bin/python benchmarks/speculation.py real --workload repetitive --streams 1,4,16,64
    .venv/bin/python benchmarks/speculation.py real --workload chat --streams 1,4,16,64
    # the simulator (a roofline cost model), acceptance per workload:
    .venv/bin/python benchmarks/speculation.py sim --model llama-3.1-8b --hardware h100 \
        --acceptance 0.75 --streams 1,2,4,8,16,32,64,128,256

Workloads (real engine): `repetitive` asks the model to repeat and lightly edit a passage it is
given (code editing / summarization-like: the output copies spans of the prompt, where prompt
lookup finds its matches); `chat`: short open questions (little to copy). Greedy decoding, so
the outputs with and without speculation must be identical: the script checks it.

Writes results/speculation_<mode>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from heddle.engine.engine import Engine
from heddle.request import SamplingParams


def speculation_configs(method: str, k: int) -> dict[str, SpeculativeConfig]:
    return {
        "off": SpeculativeConfig(method="off"),
        f"fixed-k{k}": SpeculativeConfig(method=method, num_draft_tokens=k, adaptive=False),
        "adaptive": SpeculativeConfig(method=method, num_draft_tokens=k, adaptive=True),
    }


def closed_loop(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams,
    streams: int,
    seconds: Any,
    prefix: str = "r",
) -> dict[str, Any]:
    """Keep `streams` requests in flight until every prompt has finished. `seconds()` is the
    engine's clock (wall or virtual)."""
    outputs: dict[str, list[int]] = {}
    next_index = 0
    in_flight = 0
    start = seconds()
    steps = 0
    while next_index < len(prompts) or in_flight:
        while in_flight < streams and next_index < len(prompts):
            engine.add_request(f"{prefix}{next_index}", prompts[next_index], params)
            next_index += 1
            in_flight += 1
        for out in engine.step():
            if out.finished:
                outputs[out.request_id.removeprefix(prefix)] = list(out.outputs[0].token_ids)
                in_flight -= 1
        steps += 1
    elapsed = seconds() - start
    tokens = sum(len(t) for t in outputs.values())
    spec = engine.scheduler.speculator
    drafted = spec.acceptance.num_drafted if spec is not None else 0
    accepted = spec.acceptance.num_accepted if spec is not None else 0
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_second": tokens / elapsed,
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "drafts_per_step": drafted / steps,
        "outputs": outputs,
    }


# -- the simulator -----------------------------------------------------------------------------


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.sim import RooflineCostModel, SimulatedExecutor, kv_cache_blocks, load_model_spec
    from heddle.sim.simulator import SIM_EOS_TOKEN_ID
    from heddle.spec.sim import SimAcceptance

    model = load_model_spec(args.model)
    cost = RooflineCostModel(model, args.hardware, tp=model.default_tp)
    budget, block = args.budget, 16
    rows: list[dict[str, Any]] = []
    for streams in args.streams:
        seats = max(streams, 1)
        num_blocks = kv_cache_blocks(model, args.hardware, block, tp=model.default_tp,
                                     max_num_batched_tokens=budget, max_num_seqs=seats)
        prompt_len, output_len = args.prompt_len, args.output_len
        num = max(args.requests, 4 * streams)
        prompts = [[1 + (i * 7919 + j) % 30000 for j in range(prompt_len)] for i in range(num)]
        for name, spec in speculation_configs("sim", args.k).items():
            clock = VirtualClock()
            config = EngineConfig(
                cache=CacheConfig(block_size=block, num_blocks=num_blocks),
                scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seats,
                                          speculation=spec),
            )
            executor = SimulatedExecutor(cost, clock, model.vocab_size,
                                         acceptance=SimAcceptance(args.acceptance, args.spread))
            engine = Engine(config, executor, num_blocks=num_blocks, clock=clock,
                            eos_token_id=SIM_EOS_TOKEN_ID, vocab_size=model.vocab_size,
                            record_steps=False, final_outputs_only=True)
            params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
            result = closed_loop(engine, prompts, params, streams, clock.now)
            result.pop("outputs")
            rows.append({"streams": streams, "mode": name, **result})
    return {"mode": "sim", "model": args.model, "hardware": args.hardware, "budget": budget,
            "acceptance": args.acceptance, "spread": args.spread, "k": args.k, "rows": rows}


# -- the real engine ---------------------------------------------------------------------------

PASSAGE = (
    "def load_config(path):\n    with open(path) as f:\n        data = json.load(f)\n"
    "    if 'name' not in data:\n        raise ValueError('missing name')\n"
    "    data['port'] = int(data.get('port', 8080))\n    return Config(**data)\n\n"
    "def save_config(config, path):\n    with open(path, 'w') as f:\n"
    "        json.dump(config.to_dict(), f, indent=2)\n"
)
CHAT = [
    "What is the capital of France?", "Give me three tips for sleeping better.",
    "Why is the sky blue?", "Write a haiku about autumn.", "How do vaccines work?",
    "What is a good name for a cat?", "Explain recursion to a child.",
    "What should I cook tonight?",
]


def real_prompts(tokenizer: Any, workload: str, num: int) -> list[list[int]]:
    out = []
    for i in range(num):
        if workload == "repetitive":
            text = (f"Here is a Python file:\n\n{PASSAGE}\nRewrite the file exactly, but rename "
                    f"load_config to read_config_{i}. Output only the code.")
        else:
            text = CHAT[i % len(CHAT)] + f" (question {i})"
        messages = [{"role": "user", "content": text}]
        out.append(tokenizer.encode(tokenizer.apply_chat_template(messages)))
    return out


def run_real(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.model.executor import ModelExecutor

    model_config = EngineConfig().model
    cache = CacheConfig(block_size=16, num_blocks=1280)
    executor = ModelExecutor(model_config, cache)
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    rows: list[dict[str, Any]] = []
    mismatches = 0
    for streams in args.streams:
        num = max(args.requests, streams)
        prompts = real_prompts(tokenizer, args.workload, num)
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
        reference: dict[str, list[int]] | None = None
        for name, spec in speculation_configs("ngram", args.k).items():
            runs = []
            for repeat in range(args.repeats):
                config = EngineConfig(
                    cache=cache,
                    scheduler=SchedulerConfig(max_num_batched_tokens=args.budget,
                                              max_num_seqs=max(streams, 1), speculation=spec),
                )
                engine = Engine(config, executor, num_blocks=cache.num_blocks,
                                tokenizer=tokenizer, eos_token_id=executor.eos_token_id,
                                max_model_len=executor.max_model_len,
                                vocab_size=executor.model_shape.vocab_size, record_steps=False)
                runs.append(closed_loop(engine, prompts, params, streams, time.perf_counter,
                                        prefix=f"{streams}-{name}-{repeat}-"))
            outputs = runs[0].pop("outputs")
            for r in runs[1:]:
                r.pop("outputs")
            if reference is None:
                reference = outputs
            elif outputs != reference:
                mismatches += sum(outputs[k] != reference[k] for k in reference)
            best = statistics.median(r["tokens_per_second"] for r in runs)
            rows.append({"streams": streams, "mode": name, **runs[0],
                         "tokens_per_second": best,
                         "tokens_per_second_runs": [r["tokens_per_second"] for r in runs]})
            print(f"  streams={streams} {name}: {best:.1f} tok/s", flush=True)
    return {"mode": "real", "workload": args.workload, "k": args.k, "rows": rows,
            "greedy_mismatches": mismatches}


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    lines = ["| streams | " + " | ".join(f"{m} tok/s" for m in modes)
             + " | adaptive / off | fixed / off | acceptance (adaptive) |",
             "|---" * (len(modes) + 4) + "|"]
    for streams in dict.fromkeys(r["streams"] for r in rows):
        by = {r["mode"]: r for r in rows if r["streams"] == streams}
        off = by["off"]["tokens_per_second"]
        fixed = next(v for k, v in by.items() if k.startswith("fixed"))
        acc = by["adaptive"]["acceptance"]
        lines.append(
            f"| {streams} | " + " | ".join(f"{by[m]['tokens_per_second']:.1f}" for m in modes)
            + f" | {by['adaptive']['tokens_per_second'] / off:.3f}"
            + f" | {fixed['tokens_per_second'] / off:.3f}"
            + f" | {'-' if acc is None else f'{acc:.2f}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["sim", "real"])
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4, 16, 64])
    parser.add_argument("--k", type=int, default=4, help="the most drafts per request and step")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=256, help="sim only")
    parser.add_argument("--budget", type=int, default=None,
                        help="token budget per step (default: 8192 sim, 512 real)")
    parser.add_argument("--workload", choices=["repetitive", "chat"], default="repetitive")
    parser.add_argument("--repeats", type=int, default=1, help="real only")
    parser.add_argument("--model", default="llama-3.1-8b", help="sim only")
    parser.add_argument("--hardware", default="h100", help="sim only")
    parser.add_argument("--acceptance", type=float, default=0.75, help="sim only")
    parser.add_argument("--spread", type=float, default=0.2, help="sim only")
    args = parser.parse_args()
    if args.budget is None:
        args.budget = 8192 if args.mode == "sim" else 512
    result = run_sim(args) if args.mode == "sim" else run_real(args)
    cpu = platform.processor() or platform.machine()
    print(f"\n{args.mode}: {json.dumps({k: v for k, v in result.items() if k != 'rows'})}; "
          f"host {cpu}")
    print(table(result))
    Path("results").mkdir(exist_ok=True)
    name = args.mode if args.mode == "sim" else f"real_{args.workload}"
    Path(f"results/speculation_{name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
