"""Step time of a decode batch with 0, 1, 8, 32 grammar-constrained sequences out of 32.

    /work/tools/bench /work/tools/py benchmarks/grammar_overhead.py [--rounds 3] [--steps 24]

The real engine (schedule -> grammar bitmask -> forward -> sample -> update) on the embedded
SmolLM2-135M: 32 requests decode together; the first k of them follow a JSON schema (an array
of at least 10 objects, so none completes during the measurement), the rest are free
(ignore_eos, so none stops). After every request has its first token, `--steps` engine steps
are timed. Settings are interleaved round by round (k = 0, 1, 8, 32, then again), with the
bitmask filled on the worker thread while the forward pass runs (`overlap`) and, for
comparison, on the engine thread before it (`serial`). Prints medians, the overhead against
k = 0 (also over the first and the second half of each round's steps: a steady overhead does
not move between them), the mask-fill time alone, the in-batch cost per constrained row (the
serial slope) and, beside it, what `heddle profile` measures as the simulator's per-row term
(heddle.structured.cost.measure_row_cost: fill + apply + accept, alone, on 8 rows); writes
JSON under results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.hostinfo import machine_line
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams
from heddle.structured.cost import SCHEMA, measure_row_cost
from heddle.structured.spec import GrammarSpec


def build_engine(executor: ModelExecutor, batch: int) -> Engine:
    config = EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=executor.num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=4096),
    )
    return Engine(
        config,
        executor,
        num_blocks=executor.num_blocks,
        tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id,
        max_model_len=executor.max_model_len,
        vocab_size=executor.model_shape.vocab_size,
        record_steps=False,
    )


def one_round(engine: Engine, prompts: list[list[int]], constrained: int, steps: int,
              round_index: int) -> tuple[list[float], list[float]]:
    """(engine step times, mask-fill times) with `constrained` of the requests under SCHEMA."""
    spec = GrammarSpec.json_schema(SCHEMA)
    ids = []
    for i, prompt in enumerate(prompts):
        request_id = f"k{constrained}-r{round_index}-{i}"
        params = SamplingParams(max_tokens=steps + 40, temperature=0.8, seed=i,
                                ignore_eos=i >= constrained)
        engine.add_request(request_id, prompt, params,
                           grammar=spec if i < constrained else None)
        ids.append(request_id)
    requests = engine.scheduler.requests
    for _ in range(20):  # prefill until every request has sampled its first token
        engine.step()
        if all(requests[r].num_output_tokens > 0 for r in ids):
            break
    times: list[float] = []
    fills: list[float] = []
    grammars = engine.grammars
    for _ in range(steps):
        if engine.num_unfinished_requests != len(prompts):
            break
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        if grammars is not None and constrained:
            matchers = [grammars._entries[r].matcher for r in ids[:constrained]]
            t0 = time.perf_counter()
            grammars._fill(matchers)
            fills.append(time.perf_counter() - t0)
    for request_id in ids:
        engine.abort_request(request_id)
    return times, fills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--constrained", type=int, nargs="+", default=[0, 1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--row-repeats", type=int, default=64,
                        help="repeats of the per-row cost measured alone (measure_row_cost)")
    parser.add_argument("--output", default="results/grammar_overhead.json")
    args = parser.parse_args()

    executor = ModelExecutor(ModelConfig(num_threads=args.threads), CacheConfig(block_size=16))
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    engine = build_engine(executor, args.batch)
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": f"List {10 + i} items of inventory {i} as JSON."}]
        ))
        for i in range(args.batch)
    ]
    print(f"cpu: {machine_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"capability {torch.backends.cpu.get_cpu_capability()}; dtype {executor.dtype}")
    print(f"batch {args.batch}, {args.steps} timed steps x {args.rounds} rounds per setting")
    # Warm up: compile the schema, build the kernels.
    one_round(engine, prompts, args.batch, 3, -1)
    results: dict[str, dict[int, list[float]]] = {"overlap": {}, "serial": {}}
    halves: dict[str, dict[int, tuple[list[float], list[float]]]] = {"overlap": {}, "serial": {}}
    fills: dict[int, list[float]] = {}
    for round_index in range(args.rounds):
        for mode in ("overlap", "serial"):
            engine.overlap_grammar = mode == "overlap"
            for k in args.constrained:
                times, fill = one_round(engine, prompts, k, args.steps, round_index)
                results[mode].setdefault(k, []).extend(times)
                first, second = halves[mode].setdefault(k, ([], []))
                first.extend(times[: len(times) // 2])
                second.extend(times[len(times) // 2 :])
                fills.setdefault(k, []).extend(fill)
    summary: dict[str, object] = {"cpu": machine_line(), "threads": torch.get_num_threads(),
                                  "batch": args.batch, "steps": args.steps,
                                  "rounds": args.rounds, "schema": SCHEMA, "modes": {}}
    for mode, by_k in results.items():
        base = statistics.median(by_k[0]) if 0 in by_k else None
        base_halves = [statistics.median(h) for h in halves[mode][0]] if base else None
        rows = {}
        print(f"\n{mode}: k constrained of {args.batch} | median step ms | overhead vs k=0 "
              "| first half | second half | mask fill ms (alone)")
        for k, times in by_k.items():
            median = statistics.median(times)
            fill = statistics.median(fills[k]) if fills.get(k) else 0.0
            overhead = (median / base - 1) if base else 0.0
            by_half = [0.0, 0.0]
            if base_halves:
                by_half = [statistics.median(h) / b - 1
                           for h, b in zip(halves[mode][k], base_halves, strict=True)]
            rows[k] = {"median_step_s": median, "overhead": overhead, "mask_fill_s": fill,
                       "overhead_first_half": by_half[0], "overhead_second_half": by_half[1],
                       "num_steps": len(times)}
            print(f"  {k:3d} | {median * 1e3:8.2f} | {overhead * 100:+6.1f}% "
                  f"| {by_half[0] * 100:+6.1f}% | {by_half[1] * 100:+6.1f}% | {fill * 1e3:.3f}")
        summary["modes"][mode] = rows  # type: ignore[index]
    if 0 in results["serial"] and max(args.constrained) > 0:
        k_max = max(args.constrained)
        per_row = (statistics.median(results["serial"][k_max])
                   - statistics.median(results["serial"][0])) / k_max
        summary["constrained_row_s"] = max(per_row, 0.0)
        print(f"\nper constrained row in the batch (serial slope, k=0 to {k_max}): "
              f"{per_row * 1e6:.1f} us")
    cost = measure_row_cost(tokenizer, executor.model_shape.vocab_size, rows=8,
                            repeats=args.row_repeats)
    summary["row_cost"] = cost.as_dict()
    print(f"per constrained row alone (heddle profile's constrained_rows term, 8 rows, "
          f"{cost.repeats} repeats): {cost.per_row_s * 1e6:.1f} us = fill "
          f"{cost.fill_s / 8 * 1e6:.1f} + apply {cost.apply_s / 8 * 1e6:.1f} + accept "
          f"{cost.accept_s / 8 * 1e6:.1f}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
