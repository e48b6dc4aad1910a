"""Real-engine time outside the executor, in decode steps only, per batch size.

For each batch size B: B requests (seeded prompts of --prompt-len tokens, ignore_eos) are
admitted and prefilled; once every one of them decodes, the engine's counters
(`execute_seconds`, `overhead_seconds`) are reset and --decode-steps steps are timed. A step
that computes anything but one token per request would spoil the figure, so the script checks
that every timed step was a pure decode step. Reported per B: the median step time and the
share of step time spent outside `Executor.execute()` (scheduler, KV bookkeeping, block
hashing, output processing).

Also measured in the same run: the prefix cache's block hash (per full block) and what it
costs a decode step at each batch size (a decode step fills B / block_size blocks on average).

    /work/tools/bench /work/tools/py benchmarks/engine_overhead.py
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from heddle.engine.llm import LLM
from heddle.hostinfo import cpu_model
from heddle.request import SamplingParams


def _median_per_call(fn: Any, first: Any, tokens: list[int], repeats: int) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        h = first
        for _ in range(repeats):
            h = fn(h, tokens)
        rounds.append((time.perf_counter() - start) / repeats)
    return statistics.median(rounds)


def hash_seconds_per_block(block_size: int, repeats: int = 20000) -> dict[str, float]:
    """Median over 5 rounds of the time to hash one full block chained from its parent: the
    prefix cache's SHA-256 and, side by side, the built-in `hash()` of a (parent, tokens)
    tuple that it replaced."""
    from heddle.core.block_hash import hash_block_tokens, root_hash

    tokens = [random.Random(i).randrange(100, 32000) for i in range(block_size)]

    def builtin(parent: int, token_ids: list[int]) -> int:
        return hash((parent, tuple(token_ids)))

    return {
        "sha256": _median_per_call(hash_block_tokens, root_hash("bench"), tokens, repeats),
        "builtin_hash": _median_per_call(builtin, 0, tokens, repeats),
    }


TOKEN_BUDGET = 2048


def max_output_tokens(batch: int, prompt_len: int, decode_steps: int) -> int:
    """Enough that no request finishes in the timed steps: the first requests decode while the
    last ones are still prefilled (about batch * prompt_len / TOKEN_BUDGET steps)."""
    return decode_steps + 16 + -(-batch * prompt_len // TOKEN_BUDGET)


def measure(llm: LLM, batch: int, prompt_len: int, decode_steps: int, seed: int) -> dict[str, Any]:
    engine = llm.engine
    rng = random.Random(seed + batch)
    vocab = engine.vocab_size or 32000
    ids = [f"b{batch}-{i}" for i in range(batch)]
    params = SamplingParams(
        max_tokens=max_output_tokens(batch, prompt_len, decode_steps),
        ignore_eos=True,
        temperature=0.0,
    )
    for request_id in ids:
        prompt = [rng.randrange(100, vocab) for _ in range(prompt_len)]
        engine.add_request(request_id, prompt, params)
    # Prefill: step until every request has its first token.
    started: set[str] = set()
    while len(started) < batch:
        for output in engine.step():
            started.add(output.request_id)
    steps_before = len(engine.step_stats)
    engine.execute_seconds = engine.overhead_seconds = 0.0
    step_times = []
    for _ in range(decode_steps):
        start = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - start)
    timed = engine.step_stats[steps_before:]
    if len(timed) != decode_steps or any(
        s.num_prefill_tokens or s.num_decode_tokens != batch for s in timed
    ):
        raise RuntimeError(f"batch {batch}: a timed step was not a pure decode step of {batch}")
    execute, overhead = engine.execute_seconds, engine.overhead_seconds
    for request_id in ids:
        engine.abort_request(request_id)
    engine.check_integrity()
    return {
        "batch": batch,
        "decode_steps": decode_steps,
        "step_ms_median": 1000 * statistics.median(step_times),
        "execute_s": execute,
        "overhead_s": overhead,
        "overhead_share": overhead / (execute + overhead),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/engine_overhead.json")
    args = parser.parse_args()

    batches = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(
        dtype="float32",
        num_threads=args.num_threads,
        max_num_seqs=max(batches),
        max_num_batched_tokens=TOKEN_BUDGET,
        block_size=16,
        num_blocks=max(batches)
        * (args.prompt_len + max_output_tokens(max(batches), args.prompt_len, args.decode_steps))
        // 16
        + 2 * max(batches)
        + 64,
    )
    print(f"machine: {cpu_model()}, {platform.machine()}, torch threads {args.num_threads}")
    measure(llm, 1, args.prompt_len, 4, args.seed)  # warm up kernels and the allocator
    rows = [measure(llm, b, args.prompt_len, args.decode_steps, args.seed) for b in batches]
    hashes = hash_seconds_per_block(16)
    per_block = hashes["sha256"]
    print(
        f"block hash: sha256 {1e6 * per_block:.2f} us per full block of 16 tokens "
        f"(built-in hash() of a tuple: {1e6 * hashes['builtin_hash']:.2f} us)"
    )
    print(f"{'batch':>5} {'step ms':>8} {'outside executor':>17} {'hashing / step':>15}")
    for row in rows:
        hash_share = per_block * row["batch"] / 16 / (row["step_ms_median"] / 1000)
        row["hash_share"] = hash_share
        print(
            f"{row['batch']:5d} {row['step_ms_median']:8.1f} "
            f"{100 * row['overhead_share']:16.2f}% {100 * hash_share:14.4f}%"
        )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps(
            {"machine": cpu_model(), "hash_seconds_per_block": hashes, "rows": rows}, indent=1
        )
    )


if __name__ == "__main__":
    main()
