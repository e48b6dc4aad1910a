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
from the tokens generated, per class, within the request's max_tokens), the same without the
max_tokens bound, and the arrival-time `OutputLenPredictor` (its one prediction minus the
tokens generated). Requests arriving in the first `--warmup` share are left out; tau is also
given for the first and second half of the rest by arrival (does it move with the run's
length?). The model has no thinking phase, so every request is in its answer phase.
`--seconds` bounds the run: the requests unfinished then are left out, so a short run
undercounts long requests. The timeline is on the engine's step clock, so the figure does not
depend on the machine's speed (a long run may go in the background, niced, `--threads 1`).
`--replay` re-reads a saved run (or the `.partial.json` a running one writes every 200
steps, scored on its first arrivals that have all finished) without the model.

    /work/tools/py benchmarks/predictor_accuracy_real.py --requests 960 --streams 48 \
        --threads 1 --out results/pred_real_960.json  # 160 requests: 116 s, 2 quiet CPUs
    /work/tools/py benchmarks/predictor_accuracy_real.py --replay results/pred_real_960.json \
        --streams 48

Writes `--out` (default results/predictor_accuracy_real.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import bisect
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
    max_tokens: int | None = None


def replay_accuracy(records: list[Record], warmup: float = 0.1,
                    checkpoints: tuple[int, ...] = CHECKPOINTS,
                    scored: int | None = None) -> dict[str, Any]:
    """Replay the predictors on the records' timeline; per checkpoint the requests still
    running there (output_len > checkpoint) that arrived after the first `warmup` share (of
    the first `scored` arrivals, when given: the rest still teach), and the Kendall tau-b of
    predicted against actual remaining length, over them all and over the first and second
    half of them by arrival. At equal times a prediction comes before a finish (a predictor
    never learns from a finish it could not have seen). Three predictors: the re-predictor
    (`RemainingLenPredictor`, bounded by each request's max_tokens), the same without the
    bound, and the arrival-time `OutputLenPredictor` (its one prediction minus the tokens
    generated)."""
    order = sorted(range(len(records)), key=lambda i: records[i].arrival)
    pool = order if scored is None else order[:scored]
    kept_order = pool[int(warmup * len(pool)):]
    kept = set(kept_order)
    half = {i: 0 if k < len(kept_order) // 2 else 1 for k, i in enumerate(kept_order)}
    events: list[tuple[float, int, int, int]] = []  # (time, 0 predict / 1 finish, index, cp)
    for i, rec in enumerate(records):
        for c in checkpoints:
            if rec.output_len > c:
                events.append((rec.arrival if c == 0 else rec.reached[c], 0, i, c))
        events.append((rec.finish, 1, i, -1))
    events.sort()
    repredictors = {"repredict": RemainingLenPredictor(checkpoints=checkpoints),
                    "repredict_unbounded": RemainingLenPredictor(checkpoints=checkpoints,
                                                                 use_max_tokens=False)}
    arrival = OutputLenPredictor()
    requests = [Request(f"r{i}", [0] * rec.prompt_len, SamplingParams(max_tokens=rec.max_tokens),
                        0.0, request_class=rec.request_class) for i, rec in enumerate(records)]
    base: dict[int, list[tuple[float, int, int]]] = {c: [] for c in checkpoints}
    to_bound = {c: 0 for c in checkpoints}  # re-predictions sent to the request's max_tokens
    unlearnt = {c: 0 for c in checkpoints}  # made before the class had min_samples finishes
    unlearnt_by_class: dict[int, dict[str, int]] = {c: {} for c in checkpoints}
    finished: dict[str, int] = {}
    bounded = repredictors["repredict"]
    for _, kind, i, c in events:
        request, rec = requests[i], records[i]
        if kind == 1:
            finished[rec.request_class] = finished.get(rec.request_class, 0) + 1
        elif i in kept and finished.get(rec.request_class, 0) < bounded.min_samples:
            unlearnt[c] += 1
            unlearnt_by_class[c][rec.request_class] = (
                unlearnt_by_class[c].get(rec.request_class, 0) + 1)
        if kind == 0:
            request.all_token_ids[request.num_prompt_tokens:] = [1] * c
            before = bounded.num_to_bound
            for predictor in repredictors.values():
                predictor.predict_remaining(request)
            if i in kept:
                to_bound[c] += bounded.num_to_bound - before
            base[c].append((max(1.0, arrival.predict(request) - c), rec.output_len - c, i))
        else:
            request.all_token_ids[request.num_prompt_tokens:] = [1] * rec.output_len
            request.finish_reason = (FinishReason.LENGTH if rec.finish_reason == "length"
                                     else FinishReason.STOP)
            for predictor in repredictors.values():
                predictor.observe(request)
            arrival.observe(request)

    def tau(pairs: list[tuple[float, int, int]]) -> float:
        return kendall_tau_b([p[0] for p in pairs], [p[1] for p in pairs])

    out: dict[str, Any] = {}
    for c in checkpoints:
        by_name = {name: [(p[0], p[1], int(p[2][1:])) for p in predictor.accuracy[c]
                          if int(p[2][1:]) in kept]
                   for name, predictor in repredictors.items()}
        by_name["arrival"] = [p for p in base[c] if p[2] in kept]
        n = len(by_name["repredict"])
        row: dict[str, Any] = {"requests": n, "pairs": n * (n - 1) // 2,
                               "to_bound": to_bound[c], "class_unlearnt": unlearnt[c]}
        for name, pairs in by_name.items():
            row[f"tau_{name}"] = tau(pairs)
            row[f"tied_{name}"] = _tied_share([p[0] for p in pairs])
            classes: dict[str, list[tuple[float, int]]] = {}
            for p in pairs:
                classes.setdefault(records[p[2]].request_class, []).append((p[0], p[1]))
            row[f"by_class_{name}"] = {
                k: {"n": len(v), "predicted": sum(x for x, _ in v) / len(v),
                    "actual": sum(y for _, y in v) / len(v),
                    "class_unlearnt": unlearnt_by_class[c].get(k, 0)}
                for k, v in sorted(classes.items())}
            row[f"tau_{name}_halves"] = [tau([p for p in pairs if half[p[2]] == h])
                                         for h in (0, 1)]
        row["requests_halves"] = [sum(half[p[2]] == h for p in by_name["repredict"])
                                  for h in (0, 1)]
        out[str(c)] = row
    return out


def run_real(num: int, streams: int, max_tokens: int, seed: int, temperature: float,
             seconds: float = float("inf"), partial: Path | None = None,
             threads: int | None = None) -> tuple[list[Record], dict[str, Any]]:
    """Run the chat requests; after `seconds` of running, the requests still unfinished are
    left out of the records (said in the result: `unfinished`). Every 200 steps the finished
    records so far are written to `partial` (when given), so a long run can be read early."""
    from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from heddle.engine.engine import Engine
    from heddle.model.executor import ModelExecutor

    cache = CacheConfig(block_size=16, num_blocks=streams * (max_tokens // 16 + 8) + 64)
    executor = ModelExecutor(ModelConfig(num_threads=threads), cache)
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
                                request_class=prompts[i][0], prompt_len=len(encoded[i]),
                                max_tokens=max_tokens)
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
            if partial is not None:
                done = [r for _, r in sorted(records.items()) if r.finish >= 0]
                partial.write_text(json.dumps({"steps": step, "started": len(records),
                                               "records": _dump(done)}))
            print(f"  step {step}: {len([r for r in records.values() if r.finish >= 0])}/{num} "
                  f"done, {time.perf_counter() - started:.0f} s", flush=True)
    wall = time.perf_counter() - started
    ordered = [r for _, r in sorted(records.items()) if r.finish >= 0]
    return ordered, {"steps": step, "wall_seconds": wall, "finished": len(ordered),
                     "unfinished": len(records) - len(ordered), "not_started": num - len(records),
                     "output_tokens": sum(r.output_len for r in ordered)}


def _dump(records: list[Record]) -> list[dict[str, Any]]:
    return [{"arrival": r.arrival, "finish": r.finish, "output_len": r.output_len,
             "class": r.request_class, "prompt_len": r.prompt_len, "reached": r.reached,
             "finish_reason": r.finish_reason, "max_tokens": r.max_tokens} for r in records]


def _tied_share(values: list[float]) -> float:
    """The share of pairs a predictor ties (tau-b counts them neither way)."""
    n = len(values)
    if n < 2:
        return float("nan")
    counts: dict[float, int] = {}
    for v in values:
        counts[round(v, 6)] = counts.get(round(v, 6), 0) + 1
    return sum(k * (k - 1) for k in counts.values()) / (n * (n - 1))


def load_records(path: Path, streams: int) -> tuple[list[Record], dict[str, Any]]:
    """The records of a saved run (a finished one's JSON, or the `.partial.json` of one still
    running), and how many of the first arrivals have all finished (`complete`: only those
    may be scored; a partial run's later arrivals are missing their long requests). A
    closed loop of `streams` adds, at step s, as many requests as finished in step s - 1."""
    data = json.loads(path.read_text())
    cap = data.get("args", {}).get("max_tokens")
    records = [Record(arrival=r["arrival"], finish=r["finish"], output_len=r["output_len"],
                      request_class=r["class"], prompt_len=r["prompt_len"],
                      reached={int(k): v for k, v in r["reached"].items()},
                      finish_reason=r["finish_reason"], max_tokens=r.get("max_tokens", cap))
               for r in data["records"]]
    started = data.get("started", data.get("args", {}).get("requests", len(records)))
    finishes = sorted(r.finish for r in records)
    arrivals = sorted(r.arrival for r in records)
    complete = 0
    for a in sorted(set(arrivals)):  # how many had arrived by time a
        added = min(started, streams + bisect.bisect_right(finishes, a - 0.25))
        if bisect.bisect_right(arrivals, a) < added:
            break  # one that arrived by then has not finished
        complete = added
    return records, {"complete": min(complete, len(records)), "steps": data.get("steps",
                     data.get("run", {}).get("steps")), "utc": data.get("utc")}


def _print_table(records: list[Record], result: dict[str, Any]) -> None:
    by_class: dict[str, list[int]] = {}
    capped: dict[str, int] = {}
    for r in records:
        by_class.setdefault(r.request_class, []).append(r.output_len)
        capped[r.request_class] = capped.get(r.request_class, 0) + (r.finish_reason == "length")
    print("mean output length by class (share ended at max_tokens): " + ", ".join(
        f"{k} {sum(v) / len(v):.0f} ({capped[k] / len(v):.0%})" for k, v in sorted(by_class.items())))
    print("\n| generated tokens | requests still running (1st / 2nd half) | pairs | tau, "
          "re-predicted (1st / 2nd half) | tau, re-predicted without the max_tokens bound "
          "| tau, arrival-time (1st / 2nd half) | class not learnt yet | predicted to run to "
          "max_tokens |")
    print("|---|---|---|---|---|---|---|---|")

    def cell(row: dict[str, Any], name: str) -> str:
        h = row[f"tau_{name}_halves"]
        return f"{row[f'tau_{name}']:.3f} ({h[0]:.3f} / {h[1]:.3f})"

    for c in CHECKPOINTS:
        row = result[str(c)]
        rh = row["requests_halves"]
        print(f"| {c} | {row['requests']} ({rh[0]} / {rh[1]}) | {row['pairs']} | "
              f"{cell(row, 'repredict')} | {cell(row, 'repredict_unbounded')} | "
              f"{cell(row, 'arrival')} | {row['class_unlearnt']} | {row['to_bound']} |")
    print("\nper class: requests (of them predicted before the class had min_samples finishes: "
          "unlearnt), mean predicted remaining (re-predicted / arrival-time) and "
          "actual; share of pairs each predictor ties")
    for c in CHECKPOINTS:
        row = result[str(c)]
        rep, arr = row["by_class_repredict"], row["by_class_arrival"]
        print(f"  after {c}: " + "; ".join(
            f"{k} {v['n']} ({v['class_unlearnt']} unlearnt): "
            f"{v['predicted']:.0f} / {arr[k]['predicted']:.0f} vs {v['actual']:.0f}"
            for k, v in rep.items())
            + f"; tied {row['tied_repredict']:.0%} / {row['tied_arrival']:.0%}")


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
    parser.add_argument("--out", default="results/predictor_accuracy_real.json")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); the figure is on the step clock")
    parser.add_argument("--replay", metavar="JSON",
                        help="no run: replay a saved run's records (its .partial.json too)")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = machine_line()
    if args.replay:
        records, meta = load_records(Path(args.replay), args.streams)
        result = replay_accuracy(records, args.warmup, scored=meta["complete"])
        print(f"replay of {args.replay} ({meta['utc'] or 'a partial run'}, {meta['steps']} "
              f"steps): {len(records)} finished requests, the first {meta['complete']} "
              f"arrivals all finished (scored, less the first {args.warmup:.0%})")
        _print_table(records, result)
        return
    records, run = run_real(args.requests, args.streams, args.max_tokens, args.seed,
                            args.temperature, args.seconds,
                            out.with_suffix(".partial.json"), args.threads)
    result = replay_accuracy(records, args.warmup)
    print(f"real engine, SmolLM2-135M-Instruct Q4_1, {run['finished']} chat requests finished "
          f"of {args.requests} ({run['unfinished']} unfinished, {run['not_started']} not started "
          f"at the time limit) "
          f"({args.streams} streams, T={args.temperature}, seed {args.seed}, max_tokens "
          f"{args.max_tokens}), {run['output_tokens']} output tokens in "
          f"{run['wall_seconds']:.0f} s, {run['steps']} steps; {machine}; {utc}")
    _print_table(records, result)
    out.write_text(json.dumps({
        "args": vars(args), "utc": utc, "machine": machine, "run": run,
        "checkpoints": result,
        "records": _dump(records)}, indent=1))


if __name__ == "__main__":
    main()
