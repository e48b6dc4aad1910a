"""Why the profile and the engine disagree on decode-only steps: the same shapes, timed the
profile's ways and the engine's way, side by side in one process on one executor.

For each (batch, context) and each round (modes interleaved):
- `engine`: the real Engine with `batch` requests of `context`-token prompts, greedy, 24
  output tokens each; the median of its decode-only steps after the first (the engine's own
  step times), and apart its first decode (right after the prompts' step);
- `profile (known)`: `profile_executor(decode_runs="known")`, the fourth pass's profile (a
  warm-up as new requests, then the decodes re-run at the same position as known requests);
- `fresh (new)`: `decode_runs="new"`, every timed run sends the rows as new requests;
- `moving`: `decode_runs="moving"`, each run decodes the next position (this profile);
- `moving, 12 steps`: the rows decode on for 12 steps (median), like the engine's;
- `scattered blocks`: the same with blocks drawn from anywhere in the pool (a running
  engine's FIFO pool hands out blocks from all over it).

    python benchmarks/decode_setting.py --dtype float32 --shapes 1x64,1x400,4x256 --rounds 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from heddle.clock import WallClock
from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.hostinfo import machine_line
from heddle.model.executor import ModelExecutor
from heddle.model.profiling import build_scheduler_output, profile_executor
from heddle.model.step_log import StepRecorder
from heddle.request import SamplingParams
from heddle.sim.cost_model import StepShape

OUTPUT_LEN = 24


def engine_steps(config: EngineConfig, executor: Any, batch: int, context: int,
                 tag: str) -> list[float]:
    recorder = StepRecorder(executor)
    engine = Engine(config, recorder, num_blocks=executor.num_blocks, clock=WallClock(),
                    eos_token_id=executor.eos_token_id, max_model_len=executor.max_model_len,
                    vocab_size=executor.model_shape.vocab_size)
    rng = random.Random(context * 7 + batch)
    vocab = executor.model_shape.vocab_size
    for i in range(batch):
        prompt = [rng.randrange(1, vocab) for _ in range(context)]
        engine.add_request(f"{tag}-{i}", prompt,
                           SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0,
                                          ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return [s for shape, s in recorder.steps
            if not shape.prefill_chunks and shape.num_decode_tokens == batch]


def moving_steps(executor: Any, shape: StepShape, step_id: int, runs: int,
                 scatter: random.Random | None = None) -> list[float]:
    """A warm-up step as new requests, then `runs` steps decoding on from one position to the
    next (the sampler appends each row's token, so its next position is known)."""
    bs = executor.block_size
    longer = StepShape((), tuple(c + runs + 1 for c in shape.decode_context_lens),
                       shape.num_sampled_rows)
    first = build_scheduler_output(longer, step_id, bs, executor.num_blocks,
                                   executor.model_shape.vocab_size)
    # the blocks are those of the longer shape; start the rows at the wanted context instead
    first.num_computed_tokens = [c - 1 for c in shape.decode_context_lens]
    pool = scatter.sample(range(executor.num_blocks), executor.num_blocks) if scatter else []
    for new, c in zip(first.new_requests, shape.decode_context_lens, strict=True):
        del new.token_ids[c:]
        new.num_prompt_tokens = max(1, c - 1)
        if scatter:  # blocks from anywhere in the pool, as a running engine's FIFO pool gives
            new.block_ids[:] = [pool.pop() for _ in new.block_ids]
    executor.execute(first)
    ids = list(first.request_ids)
    times = []
    for k in range(1, runs + 1):
        so = build_scheduler_output(shape, step_id + k, bs, executor.num_blocks,
                                    executor.model_shape.vocab_size, decodes_of=step_id)
        so.num_computed_tokens = [c - 1 + k for c in shape.decode_context_lens]
        so.request_ids = ids
        start = time.perf_counter()
        executor.execute(so)
        times.append(time.perf_counter() - start)
    done = build_scheduler_output(StepShape((), (), 0), step_id + runs + 1, bs)
    done.finished_request_ids = ids
    executor.execute(done)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shapes", default="1x64,1x400,4x256")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = EngineConfig(model=ModelConfig(dtype=args.dtype),
                          cache=CacheConfig(block_size=16, kv_cache_memory_gb=0.5),
                          scheduler=SchedulerConfig(max_num_batched_tokens=256,
                                                    max_num_seqs=32))
    executor = ModelExecutor(config.model, config.cache)
    print(f"{machine_line()}; {executor.dtype}, quantization {executor.quantization}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    results: dict[tuple[int, int], dict[str, list[float]]] = {}
    step_id = 10_000
    for r in range(args.rounds):
        for batch, context in shapes:
            res = results.setdefault((batch, context), {})
            eng = engine_steps(config, executor, batch, context, f"e{r}-{batch}-{context}")
            res.setdefault("engine", []).append(statistics.median(eng[1:]))
            res.setdefault("engine first", []).append(eng[0])  # right after the prefill
            mid = context + OUTPUT_LEN // 2
            shape = StepShape((), (mid,) * batch, batch)
            for mode, name in (("known", "profile"), ("new", "fresh"), ("moving", "moving")):
                prof = profile_executor(executor.execute, [shape], executor.block_size, 3,
                                        num_blocks=executor.num_blocks,
                                        vocab_size=executor.model_shape.vocab_size,
                                        decode_runs=mode)  # fmt: skip
                res.setdefault(name, []).append(prof[0][1])
            mov = moving_steps(executor, shape, step_id, 12)
            step_id += 20
            res.setdefault("moving 12", []).append(statistics.median(mov))
            sca = moving_steps(executor, shape, step_id, 12, random.Random(step_id))
            step_id += 20
            res.setdefault("scattered", []).append(statistics.median(sca))
            print(f"round {r} {batch}x{context}: " + ", ".join(
                f"{m} {1e3 * v[-1]:.2f} ms" for m, v in res.items()), flush=True)
    print("| decode batch x context | engine ms | engine, first decode | profile (known) | "
          "fresh (new) | moving | moving, 12 steps | scattered blocks |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (batch, context), res in results.items():
        eng = statistics.median(res["engine"])
        cells = [f"{1e3 * eng:.2f}"] + [
            f"{1e3 * statistics.median(res[m]):.2f} ({statistics.median(res[m]) / eng - 1:+.1%})"
            for m in ("engine first", "profile", "fresh", "moving", "moving 12", "scattered")]
        print(f"| {batch} x {context}+ | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
