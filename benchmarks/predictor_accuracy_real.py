"""Remaining-length prediction on REAL runs: Kendall tau after 0, 64, 256 generated tokens.

The real-run half of benchmarks/predictor_accuracy.py. The real engine runs the embedded
model (SmolLM2-135M-Instruct Q4_1 GGUF, chat template) on chat requests of five kinds (the
request's class: short facts, explanations, lists, stories, code), sampled with a fixed
seed per request, up to `--max-tokens`, ending at EOS, `--streams` in flight (closed loop).
Per request it records the arrival order, the engine step at which it had 0, 64 and 256
output tokens, its finish step, class and real output length.

The predictors are then replayed on that timeline, as sjf would have used them: at each
checkpoint a request still running there (more output tokens than the checkpoint) is
predicted by a predictor that has learnt only from requests that finished earlier, and the
prediction is paired with its actual remaining length: `RemainingLenPredictor` (re-predicts
from the tokens generated, per class) and the arrival-time `OutputLenPredictor` (its one
prediction minus the tokens generated). Requests arriving in the first `--warmup` share are
left out. The model has no thinking phase, so every request is in its answer phase.
`--seconds` bounds the run: the requests unfinished then (the last to arrive, the long ones
among them most) are left out of the replay, so a short run undercounts long requests.

    /work/tools/py benchmarks/predictor_accuracy_real.py --requests 160 --streams 48 \
        --seconds 600     # ~11 min on 2 busy CPUs

Writes results/predictor_accuracy_real.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle.core.policies.predictor import CHECKPOINTS, OutputLenPredictor, RemainingLenPredictor
from heddle.metrics.rank import kendall_tau_b
from heddle.request import FinishReason, Request, SamplingParams

TOPICS = ["the ocean", "volcanoes", "the moon", "honey bees", "trains", "coffee", "chess",
          "rainforests", "the internet", "bicycles", "glaciers", "music", "bread", "owls"]
TEMPLATES: dict[str, list[str]] = {
    "fact": ["In one sentence, what is {t}?", "Give a one-word answer: is {t} old or new?",
             "Name one fact about {t}. Be brief."],
    "explain": ["Explain how {t} works.", "Why is {t} important?",
                "What are the pros and cons of {t}?"],
    "list": ["Give me five tips about {t}.", "List ten facts about {t}.",
             "List three questions people ask about {t}."],
    "story": ["Write a long, detailed story about {t}.",
              "Write a long essay about the history of {t}, with many paragraphs.",
              "Write a poem of twenty lines about {t}."],
    "code": ["Write a Python function that prints a fact about {t}.",
             "Write a Python class that models {t}, with docstrings and examples."],
}


def chat_prompts(num: int, seed: int) -> list[tuple[str, str]]:
    """`num` (class, text) pairs: the classes in turn, template and topic drawn with `seed`."""
    rng = random.Random(seed)
    classes = list(TEMPLATES)
    out = []
    for i in range(num):
        cls = classes[i % len(classes)]
        out.append((cls, rng.choice(TEMPLATES[cls]).format(t=rng.choice(TOPICS))))
    rng.shuffle(out)
    return out


@dataclass(slots=True)
class Record:
    """One real request: when it arrived, had each checkpoint's tokens and finished (any
    clock: engine steps here), its class, prompt and output length, and why it ended."""

    arrival: float
    finish: float
    output_len: int
    request_class: str = "default"
    prompt_len: int = 16
    reached: dict[int, float] = field(default_factory=dict)  # checkpoint -> time (0: arrival)
    finish_reason: str = "stop"


def replay_accuracy(records: list[Record], warmup: float = 0.1,
                    checkpoints: tuple[int, ...] = CHECKPOINTS) -> dict[str, Any]:
    """Replay both predictors on the records' timeline; per checkpoint the requests still
    running there (output_len > checkpoint) that arrived after the first `warmup` share, and
    the Kendall tau-b of predicted against actual remaining length. At equal times a
    prediction comes before a finish (a predictor never learns from a finish it could not
    have seen)."""
    order = sorted(range(len(records)), key=lambda i: records[i].arrival)
    kept = set(order[int(warmup * len(records)):])
    events: list[tuple[float, int, int, int]] = []  # (time, 0 predict / 1 finish, index, cp)
    for i, rec in enumerate(records):
        for c in checkpoints:
            if rec.output_len > c:
                events.append((rec.arrival if c == 0 else rec.reached[c], 0, i, c))
        events.append((rec.finish, 1, i, -1))
    events.sort()
    repredict = RemainingLenPredictor()
    arrival = OutputLenPredictor()
    requests = [Request(f"r{i}", [0] * rec.prompt_len, SamplingParams(max_tokens=None), 0.0,
                        request_class=rec.request_class) for i, rec in enumerate(records)]
    base: dict[int, list[tuple[float, int, int]]] = {c: [] for c in checkpoints}
    for _, kind, i, c in events:
        request, rec = requests[i], records[i]
        if kind == 0:
            request.all_token_ids[request.num_prompt_tokens:] = [1] * c
            repredict.predict_remaining(request)
            base[c].append((max(1.0, arrival.predict(request) - c), rec.output_len - c, i))
        else:
            request.all_token_ids[request.num_prompt_tokens:] = [1] * rec.output_len
            request.finish_reason = (FinishReason.LENGTH if rec.finish_reason == "length"
                                     else FinishReason.STOP)
            repredict.observe(request)
            arrival.observe(request)
    out: dict[str, Any] = {}
    for c in checkpoints:
        pairs = [p for p in repredict.accuracy[c] if int(p[2][1:]) in kept]
        bpairs = [p for p in base[c] if p[2] in kept]
        n = len(pairs)
        out[str(c)] = {
            "requests": n, "pairs": n * (n - 1) // 2,
            "tau_repredict": kendall_tau_b([p[0] for p in pairs], [p[1] for p in pairs]),
            "tau_arrival": kendall_tau_b([p[0] for p in bpairs], [p[1] for p in bpairs]),
        }
    return out


def run_real(num: int, streams: int, max_tokens: int, seed: int, temperature: float,
             seconds: float = float("inf")) -> tuple[list[Record], dict[str, Any]]:
    """Run the chat requests; after `seconds` of running, the requests still unfinished are
    left out of the records (said in the result: `unfinished`)."""
    from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from heddle.engine.engine import Engine
    from heddle.model.executor import ModelExecutor

    cache = CacheConfig(block_size=16, num_blocks=streams * (max_tokens // 16 + 8) + 64)
    executor = ModelExecutor(ModelConfig(), cache)
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    engine = Engine(EngineConfig(cache=cache, scheduler=SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=streams)), executor,
        num_blocks=executor.num_blocks, tokenizer=tokenizer,
        eos_token_id=executor.eos_token_id, max_model_len=executor.max_model_len,
        vocab_size=executor.model_shape.vocab_size, record_steps=False)
    prompts = chat_prompts(num, seed)
    encoded = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": text}])) for _, text in prompts]
    records: dict[int, Record] = {}
    step = next_index = in_flight = 0
    started = time.perf_counter()
    while (next_index < num or in_flight) and time.perf_counter() - started < seconds:
        while in_flight < streams and next_index < num:
            i = next_index
            params = SamplingParams(temperature=temperature, top_p=0.95, seed=seed * 100003 + i,
                                    max_tokens=max_tokens)
            engine.add_request(str(i), encoded[i], params, request_class=prompts[i][0])
            records[i] = Record(arrival=step - 0.5, finish=-1.0, output_len=0,
                                request_class=prompts[i][0], prompt_len=len(encoded[i]))
            next_index += 1
            in_flight += 1
        for out in engine.step():
            i = int(out.request_id)
            rec = records[i]
            n = len(out.outputs[0].token_ids)
            for c in CHECKPOINTS:
                if c and c not in rec.reached and n >= c:
                    rec.reached[c] = float(step)
            if out.finished:
                rec.finish = step + 0.25
                rec.output_len = n
                rec.finish_reason = str(out.outputs[0].finish_reason or "stop")
                in_flight -= 1
        step += 1
        if step % 200 == 0:
            print(f"  step {step}: {len([r for r in records.values() if r.finish >= 0])}/{num} "
                  f"done, {time.perf_counter() - started:.0f} s", flush=True)
    wall = time.perf_counter() - started
    ordered = [r for _, r in sorted(records.items()) if r.finish >= 0]
    return ordered, {"steps": step, "wall_seconds": wall, "finished": len(ordered),
                     "unfinished": len(records) - len(ordered), "not_started": num - len(records),
                     "output_tokens": sum(r.output_len for r in ordered)}


def main() -> None:
    from heddle.hostinfo import machine_line

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--warmup", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=float("inf"),
                        help="stop after this long; requests unfinished then are left out")
    args = parser.parse_args()
    utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    records, run = run_real(args.requests, args.streams, args.max_tokens, args.seed,
                            args.temperature, args.seconds)
    result = replay_accuracy(records, args.warmup)
    machine = machine_line()
    by_class: dict[str, list[int]] = {}
    for r in records:
        by_class.setdefault(r.request_class, []).append(r.output_len)
    print(f"real engine, SmolLM2-135M-Instruct Q4_1, {run['finished']} chat requests finished "
          f"of {args.requests} ({run['unfinished']} unfinished, {run['not_started']} not started "
          f"at the time limit) "
          f"({args.streams} streams, T={args.temperature}, seed {args.seed}, max_tokens "
          f"{args.max_tokens}), {run['output_tokens']} output tokens in "
          f"{run['wall_seconds']:.0f} s; {machine}; {utc}")
    print("mean output length by class: " + ", ".join(
        f"{k} {sum(v) / len(v):.0f}" for k, v in sorted(by_class.items())))
    print("\n| generated tokens | requests still running | pairs | tau, re-predicted "
          "| tau, arrival-time |")
    print("|---|---|---|---|---|")
    for c in CHECKPOINTS:
        row = result[str(c)]
        print(f"| {c} | {row['requests']} | {row['pairs']} | {row['tau_repredict']:.3f} | "
              f"{row['tau_arrival']:.3f} |")
    Path("results").mkdir(exist_ok=True)
    Path("results/predictor_accuracy_real.json").write_text(json.dumps({
        "args": vars(args), "utc": utc, "machine": machine, "run": run,
        "checkpoints": result,
        "records": [{"arrival": r.arrival, "finish": r.finish, "output_len": r.output_len,
                     "class": r.request_class, "prompt_len": r.prompt_len,
                     "reached": r.reached, "finish_reason": r.finish_reason}
                    for r in records]}, indent=1))


if __name__ == "__main__":
    main()
