"""Speculative decoding, off vs fixed K vs adaptive K, at 1 .. 64 concurrent streams.

Closed loop: `streams` requests are in flight at all times; each finished one is replaced by
the next, until `requests` have finished. Reported: output tokens per second over the run
(median of `--repeats` runs for the real engine), the acceptance rate and drafts per step.

    # the real CPU engine (embedded SmolLM2-135M), greedy, prompt lookup:
    .venv/bin/python benchmarks/speculation.py real --workload repetitive --streams 1,4,16,64
    .venv/bin/python benchmarks/speculation.py real --workload chat --streams 1,4,16,64
    # speculation on identical work (the batch-invariant mode) and what that mode costs:
    .venv/bin/python benchmarks/speculation.py invariant-cost --workload chat \
        --points 4:3,4:6,1:3,2:3,8:3 --vary-len 32,96 --requests 4 --repeats 5
    # the simulator (a roofline cost model), acceptance per workload:
    .venv/bin/python benchmarks/speculation.py sim --model llama-3.1-8b --hardware h100 \
        --acceptance 0.75 --streams 1,2,4,8,16,32,64,128,256

Workloads (real engine): `repetitive` asks the model to repeat and lightly edit a passage it is
given (code editing / summarization-like: the output copies spans of the prompt, where prompt
lookup finds its matches); `chat`: short open questions (little to copy). Greedy decoding, so
the outputs with and without speculation must be identical: the script checks it.

The real runs also fit the simulator to themselves (deliverable 2 of issue 15): every step's
shape and duration is logged (`StepRecorder`) and a profiled cost model fitted to them
(`fit_profile`); the acceptance is measured per request in the fixed-K runs (a draft accepted
given the ones before it were: accepted / (accepted + rejections), its mean and the spread of
the per-request rates) with the share of decode steps prompt lookup had a proposal for. The
simulator then runs the same closed loop (the same prompts, each request's output length from
the run without speculation) with `method=sim` at those rates, and both crossovers are
reported: the streams at which fixed K stops paying (fixed / off falls below 1), interpolated
in log2(streams) between the measured points.

Writes results/speculation_<mode>.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from heddle.engine.engine import Engine
from heddle.hostinfo import cpuinfo, machine_line
from heddle.request import SamplingParams


def speculation_configs(method: str, k: int, **sim: float) -> dict[str, SpeculativeConfig]:
    return {
        "off": SpeculativeConfig(method="off"),
        f"fixed-k{k}": SpeculativeConfig(method=method, num_draft_tokens=k, adaptive=False, **sim),
        "adaptive": SpeculativeConfig(method=method, num_draft_tokens=k, adaptive=True, **sim),
    }


def closed_loop(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    streams: int,
    seconds: Any,
    prefix: str = "r",
) -> dict[str, Any]:
    """Keep `streams` requests in flight until every prompt has finished. `seconds()` is the
    engine's clock (wall or virtual); `params`: one for all, or one per prompt. Per request,
    the drafts verified and accepted are tallied (`per_request`: [accepted, trials], a trial
    being an accepted draft or the first rejected one of a step)."""
    outputs: dict[str, list[int]] = {}
    next_index = 0
    in_flight = 0
    spec = engine.scheduler.speculator
    tallies: dict[str, list[int]] = {}
    if spec is not None:
        observe = spec.observe

        def tally(request_id: str, num_drafts: int, num_accepted: int) -> None:
            t = tallies.setdefault(request_id, [0, 0])
            t[0] += num_accepted
            t[1] += num_accepted + (num_accepted < num_drafts)
            observe(request_id, num_drafts, num_accepted)

        spec.observe = tally  # type: ignore[method-assign]
    start = seconds()
    steps = 0
    while next_index < len(prompts) or in_flight:
        while in_flight < streams and next_index < len(prompts):
            p = params if isinstance(params, SamplingParams) else params[next_index]
            engine.add_request(f"{prefix}{next_index}", prompts[next_index], p)
            next_index += 1
            in_flight += 1
        for out in engine.step():
            if out.finished:
                outputs[out.request_id.removeprefix(prefix)] = list(out.outputs[0].token_ids)
                in_flight -= 1
        steps += 1
    elapsed = seconds() - start
    tokens = sum(len(t) for t in outputs.values())
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
        "offers": spec.num_offers if spec is not None else 0,
        "proposals": spec.num_proposals if spec is not None else 0,
        "per_request": list(tallies.values()),
        "outputs": outputs,
    }


# -- the simulator -----------------------------------------------------------------------------


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.sim import RooflineCostModel, kv_cache_blocks, load_model_spec
    from heddle.spec.sim import MEASURED_ACCEPTANCE

    model = load_model_spec(args.model)
    cost = RooflineCostModel(model, args.hardware, tp=model.default_tp)
    budget, block = args.budget, 16
    proposal_rate = 1.0
    if args.measured is not None:  # the rates measured on the real engine for that workload
        args.acceptance, args.spread, proposal_rate = MEASURED_ACCEPTANCE[args.measured]
    rows: list[dict[str, Any]] = []
    for streams in args.streams:
        seats = max(streams, 1)
        num_blocks = kv_cache_blocks(model, args.hardware, block, tp=model.default_tp,
                                     max_num_batched_tokens=budget, max_num_seqs=seats)
        prompt_len, output_len = args.prompt_len, args.output_len
        num = max(args.requests, 4 * streams)
        prompts = [[1 + (i * 7919 + j) % 30000 for j in range(prompt_len)] for i in range(num)]
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        rows += sim_rows(cost, model.vocab_size, num_blocks, budget, block, streams, prompts,
                         params, args.k, args.acceptance, args.spread, proposal_rate)
    return {"mode": "sim", "model": args.model, "hardware": args.hardware, "budget": budget,
            "acceptance": args.acceptance, "spread": args.spread, "k": args.k, "rows": rows}


def sim_rows(cost: Any, vocab_size: int, num_blocks: int, budget: int, block: int,
             streams: int, prompts: list[list[int]],
             params: SamplingParams | Sequence[SamplingParams], k: int, acceptance: float,
             spread: float, proposal_rate: float) -> list[dict[str, Any]]:
    """The three modes in the simulator at `streams`, drafts accepted at `acceptance` +-
    `spread` per request and offered in `proposal_rate` of the decode steps."""
    from heddle.sim import SimulatedExecutor
    from heddle.sim.simulator import SIM_EOS_TOKEN_ID
    from heddle.spec.sim import SimAcceptance

    rows = []
    configs = speculation_configs("sim", k, acceptance=acceptance, acceptance_spread=spread,
                                  proposal_rate=proposal_rate)
    for name, spec in configs.items():
        clock = VirtualClock()
        config = EngineConfig(
            cache=CacheConfig(block_size=block, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max(streams, 1),
                                      speculation=spec),
        )
        executor = SimulatedExecutor(cost, clock, vocab_size,
                                     acceptance=SimAcceptance(acceptance, spread))
        engine = Engine(config, executor, num_blocks=num_blocks, clock=clock,
                        eos_token_id=SIM_EOS_TOKEN_ID, vocab_size=vocab_size,
                        record_steps=False, final_outputs_only=True)
        result = closed_loop(engine, prompts, params, streams, clock.now)
        result.pop("outputs")
        result.pop("per_request")
        rows.append({"streams": streams, "mode": name, **result})
    return rows


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


def fit_acceptance(per_request: list[list[int]]) -> dict[str, float]:
    """Mean rate a draft is accepted given the earlier ones were (pooled), and the spread of
    a uniform distribution with the per-request rates' standard deviation (requests with at
    least 4 trials)."""
    accepted = sum(a for a, _ in per_request)
    trials = sum(t for _, t in per_request)
    rates = [a / t for a, t in per_request if t >= 4]
    std = statistics.pstdev(rates) if len(rates) > 1 else 0.0
    return {"acceptance": accepted / trials if trials else 0.0,
            "spread": min(0.5, math.sqrt(3.0) * std), "requests": len(rates), "trials": trials}


def crossover(rows: list[dict[str, Any]], mode: str) -> float | None:
    """The streams at which `mode` / off first falls below 1, interpolated in log2(streams)
    between the points around it; None if it never does (math.inf) or never paid (0)."""
    points = []
    for streams in sorted({r["streams"] for r in rows}):
        by = {r["mode"]: r["tokens_per_second"] for r in rows if r["streams"] == streams}
        points.append((streams, by[mode] / by["off"]))
    if points[0][1] < 1.0:
        return 0.0
    for (s0, r0), (s1, r1) in itertools.pairwise(points):
        if r1 < 1.0 <= r0:
            x0, x1 = math.log2(s0), math.log2(s1)
            return float(2.0 ** (x0 + (x1 - x0) * (r0 - 1.0) / (r0 - r1)))
    return math.inf


def lookup_stats(prompts: list[list[int]], outputs: dict[str, list[int]], k: int,
                 prefix: str = "") -> dict[str, float]:
    """How often prompt lookup proposes along the greedy outputs, and how much of it matches:
    at each output position, the proposal on the tokens known there against the tokens that
    did follow (what verification would accept)."""
    from heddle.spec.ngram import NgramProposer

    proposer = NgramProposer(2, 4)
    positions = proposed = matched = drafted = 0
    for i, prompt in enumerate(prompts):
        output = outputs[f"{prefix}{i}"]
        known = list(prompt)
        for j, token in enumerate(output):
            drafts = proposer.propose(str(i), known, k)
            positions += 1
            if drafts:
                proposed += 1
                drafted += len(drafts)
                follow = output[j : j + len(drafts)]
                matched += next((m for m, (a, b) in enumerate(zip(drafts, follow, strict=False))
                                 if a != b), min(len(drafts), len(follow)))
            known.append(token)
    return {"positions": positions, "proposal_rate": proposed / positions if positions else 0.0,
            "matched_per_proposal": matched / proposed if proposed else 0.0,
            "matched_of_drafted": matched / drafted if drafted else 0.0}


def real_engine(args: argparse.Namespace) -> tuple[Any, Any, CacheConfig]:
    from heddle.config import ModelConfig
    from heddle.model.executor import ModelExecutor
    from heddle.model.step_log import StepRecorder

    cache = CacheConfig(block_size=16, num_blocks=args.num_blocks)
    model_executor = ModelExecutor(ModelConfig(batch_invariant=args.batch_invariant), cache)
    return model_executor, StepRecorder(model_executor), cache


def make_engine(executor: Any, model_executor: Any, cache: CacheConfig, budget: int,
                seats: int, spec: SpeculativeConfig) -> Engine:
    config = EngineConfig(cache=cache, scheduler=SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=seats, speculation=spec))
    return Engine(config, executor, num_blocks=model_executor.num_blocks,
                  tokenizer=model_executor.tokenizer, eos_token_id=model_executor.eos_token_id,
                  max_model_len=model_executor.max_model_len,
                  vocab_size=model_executor.model_shape.vocab_size, record_steps=False)


def run_real(args: argparse.Namespace) -> dict[str, Any]:
    from heddle.model.step_log import save_steps

    model_executor, executor, cache = real_engine(args)
    tokenizer = model_executor.tokenizer
    assert tokenizer is not None
    rows: list[dict[str, Any]] = []
    mismatches = compared = 0
    per_request: list[list[int]] = []
    offers = proposals = 0
    lengths: dict[int, list[int]] = {}
    lookup: dict[int, dict[str, float]] = {}
    prompt_lens: dict[int, list[int]] = {}
    configs = speculation_configs("ngram", args.k)
    # Verify rows with the kernels of the step without drafts (the default), and with those
    # of its row count as well ("/rows": the kernels quantization auto picks for k + 1 rows).
    row_kernels = {f"{name}/rows": spec for name, spec in configs.items() if name != "off"}
    if args.verify_kernels == "both":
        configs.update(row_kernels)
    per_mode_mismatches: dict[str, int] = dict.fromkeys(configs, 0)
    # streams -> mode -> [outputs that differ from off's first round, outputs compared]
    mismatches_by_streams: dict[str, dict[str, list[int]]] = {}
    skipped: dict[str, dict[str, int]] = {}  # streams -> mode -> steps adaptive looked nothing up
    # Untimed warm-up of every mode (kernels built, caches touched); its steps are not fitted.
    warm = real_prompts(tokenizer, args.workload, 2)
    for (name, spec), seats in itertools.product(configs.items(), (1, 2)):
        engine = make_engine(executor, model_executor, cache, args.budget, seats, spec)
        closed_loop(engine, warm, SamplingParams(temperature=0.0, max_tokens=args.warmup_tokens),
                    seats,
                    time.perf_counter, prefix=f"warm-{name}-{seats}-")
    executor.steps.clear()
    executor.gaps.clear()
    started = time.perf_counter()
    for streams in args.streams:
        num = max(args.requests, args.per_stream * streams)
        prompts = real_prompts(tokenizer, args.workload, num)
        params = output_params(args, num)
        reference: dict[str, list[int]] | None = None
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        # Interleaved: off, fixed, adaptive, off, fixed, ... so that the machine's drift over
        # the run lands on every mode alike; the verdicts are medians of the paired ratios.
        for repeat in range(args.repeats):
            for name, spec in configs.items():
                model_executor.verify_kernels_as_decode = not (
                    name.endswith("/rows") or args.verify_kernels == "rows")
                engine = make_engine(executor, model_executor, cache, args.budget,
                                     max(streams, 1), spec)
                run = closed_loop(engine, prompts, params, streams, time.perf_counter,
                                  prefix=f"{streams}-{name}-{repeat}-")
                outputs = run.pop("outputs")
                if reference is None:
                    reference = outputs
                    lengths[streams] = [len(outputs[str(i)]) for i in range(num)]
                    prompt_lens[streams] = [len(prompt) for prompt in prompts]
                    lookup[streams] = lookup_stats(prompts, outputs, args.k)
                else:
                    compared += len(reference)
                    differ = sum(outputs[key] != reference[key] for key in reference)
                    mismatches += differ
                    per_mode_mismatches[name] += differ
                    by_streams = mismatches_by_streams.setdefault(str(streams), {})
                    counts = by_streams.setdefault(name, [0, 0])
                    counts[0] += differ
                    counts[1] += len(reference)
                if name == f"fixed-k{args.k}" and repeat == 0:
                    per_request += run["per_request"]
                    offers += run["offers"]
                    proposals += run["proposals"]
                run.pop("per_request")
                runs[name].append(run)
                if engine.scheduler.speculator is not None:
                    skipped.setdefault(str(streams), {})[f"{name}#{repeat}"] = (
                        engine.scheduler.speculator.num_steps_skipped)
                print(f"  streams={streams} {name} #{repeat}: {run['tokens_per_second']:.1f} "
                      f"tok/s ({time.perf_counter() - started:.0f} s so far)", flush=True)
        off = [r["tokens_per_second"] for r in runs["off"]]
        for name, mode_runs in runs.items():
            values = [r["tokens_per_second"] for r in mode_runs]
            rows.append({"streams": streams, "mode": name, **mode_runs[0],
                         "tokens_per_second": statistics.median(values),
                         "tokens_per_second_runs": values,
                         "output_tokens_runs": [r["output_tokens"] for r in mode_runs],
                         "ratio_to_off_runs": [v / o for v, o in zip(values, off, strict=True)],
                         "ratio_to_off": statistics.median(
                             v / o for v, o in zip(values, off, strict=True))})
        # What is measured so far survives a run cut short (a bench slot's end).
        Path("results").mkdir(exist_ok=True)
        Path(f"results/speculation_real_{args.workload}{args.tag}.partial.json").write_text(
            json.dumps({"rows": rows, "greedy_mismatches": mismatches, "compared": compared,
                        "per_request": per_request, "offers": offers, "proposals": proposals,
                        "lookup": lookup}))
    fitted = fit_acceptance(per_request)
    fitted["proposal_rate"] = proposals / offers if offers else 0.0
    steps_path = f"results/speculation_real_{args.workload}{args.tag}.steps.json"
    save_steps(steps_path, executor.steps, {"model": model_executor.model_name,
                                            "quantization": model_executor.quantization})
    from heddle.model.profiling import dispatch_rows

    return {"mode": "real", "workload": args.workload, "k": args.k, "rows": rows,
            "dispatch_rows": list(dispatch_rows(model_executor)),
            "output_len": args.output_len, "vary_len": args.vary_len, "repeats": args.repeats,
            "greedy_mismatches": mismatches, "greedy_compared": compared,
            "greedy_mismatches_by_mode": per_mode_mismatches,
            "greedy_mismatches_by_streams": mismatches_by_streams,
            "batch_invariant": args.batch_invariant, "steps_skipped": skipped,
            "verify_kernels": args.verify_kernels,
            "lookup": lookup, "fitted": fitted, "lengths": lengths, "prompt_lens": prompt_lens,
            "vocab_size": model_executor.model_shape.vocab_size, "steps_log": steps_path,
            "quantization": model_executor.quantization,
            "crossover_measured": crossover(rows, f"fixed-k{args.k}"),
            "wall_seconds": time.perf_counter() - started}


def output_params(args: argparse.Namespace, num: int) -> SamplingParams | list[SamplingParams]:
    """Greedy, `--output-len` tokens each; with `--vary-len LOW,HIGH` each request's
    max_tokens drawn uniformly in LOW..HIGH (seeded by its index: the same in every mode), so
    that requests do not all start and finish together (a steady state, not waves)."""
    if args.vary_len is None:
        return SamplingParams(temperature=0.0, max_tokens=args.output_len)
    low, high = args.vary_len
    return [SamplingParams(temperature=0.0,
                           max_tokens=low + (i * 2654435761 >> 7) % (high - low + 1))
            for i in range(num)]


def run_fit(args: argparse.Namespace) -> dict[str, Any]:
    """The simulator fitted to a real run (its saved result and step log): a profiled cost
    model on the logged steps, the acceptance measured in its fixed-K runs; the same closed
    loop at `--sim-streams` in the simulator. Virtual clock: run it under `cpu`, not bench."""
    from heddle.model.loader import load_model
    from heddle.model.step_log import load_steps
    from heddle.sim.profiled import fit_profile

    name = f"results/speculation_real_{args.workload}{args.tag}.json"
    result = json.loads(Path(name).read_text())
    steps, metadata = load_steps(result["steps_log"])
    # The kernel-switch terms at the row counts where the executor leaves a quantized kernel
    # (quantization auto): without them the fit misses the step cost's bend there.
    switches = result.get("dispatch_rows")
    if switches is None:
        switches = args.dispatch_rows
    cost = fit_profile(steps, model=metadata.get("model", "smollm2-135m"), held_out=0.25,
                       dispatch_rows=switches)
    fitted = result["fitted"]
    lengths = {int(s): v for s, v in result["lengths"].items()}
    # The real prompts themselves: they share the passage, so the prefix cache serves most of
    # each prompt in the simulator as in the real run.
    tokenizer = load_model(None).tokenizer
    assert tokenizer is not None
    sim: list[dict[str, Any]] = []
    for streams in args.sim_streams:
        num = max(args.requests, args.per_stream * streams)
        prompts = real_prompts(tokenizer, args.workload, num)
        known = lengths.get(streams) or lengths[max(lengths)]
        # Each request's output length as the run without speculation gave it (EOS included),
        # or with --vary-len drawn as the real runs' --vary-len draws it.
        params: SamplingParams | list[SamplingParams] = [
            SamplingParams(temperature=0.0, max_tokens=max(1, known[i % len(known)]),
                           ignore_eos=True) for i in range(num)]
        if args.vary_len is not None:
            params = [SamplingParams(temperature=0.0, max_tokens=p.max_tokens, ignore_eos=True)
                      for p in output_params(args, num)]  # type: ignore[union-attr]
        sim += sim_rows(cost, result["vocab_size"], args.num_blocks, args.budget, 16, streams,
                        prompts, params, result["k"], fitted["acceptance"], fitted["spread"],
                        fitted["proposal_rate"])
    fit = cost.metadata.fit if cost.metadata is not None else None
    result.update({
        "sim_rows": sim,
        "cost_fit": None if fit is None else {
            "steps": fit.num_samples, "median_abs_error": fit.median_abs_relative_error,
            "held_out_median_abs": fit.held_out_median_abs},
        "crossover_simulated": crossover(sim, f"fixed-k{result['k']}"),
        "fit_dispatch_rows": list(switches),
        "fit_vary_len": args.vary_len, "fit_per_stream": args.per_stream,
    })
    return result


def run_invariance(args: argparse.Namespace) -> dict[str, Any]:
    """Is greedy decoding batch-invariant on this path? The same prompts run one at a time and
    all at once (`--batch` seats), with speculation off and with fixed K: outputs that differ
    between the two runs of one mode, and between off and fixed K at each batch size."""
    model_executor, executor, cache = real_engine(args)
    tokenizer = model_executor.tokenizer
    assert tokenizer is not None
    prompts = real_prompts(tokenizer, args.workload, args.batch)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
    outputs: dict[str, dict[str, list[int]]] = {}
    configs = speculation_configs("ngram", args.k)
    for name in ("off", f"fixed-k{args.k}"):
        for seats in (1, args.batch):
            engine = make_engine(executor, model_executor, cache, args.budget, seats,
                                 configs[name])
            outputs[f"{name}/{seats}"] = closed_loop(
                engine, prompts, params, seats, time.perf_counter, prefix="")["outputs"]
            print(f"  {name} at {seats} seats done", flush=True)

    def differ(a: str, b: str) -> int:
        return sum(outputs[a][key] != outputs[b][key] for key in outputs[a])

    fixed, batch = f"fixed-k{args.k}", args.batch
    return {"mode": "invariance", "workload": args.workload, "prompts": batch,
            "output_len": args.output_len, "quantization": model_executor.quantization,
            "off_1_vs_off_batch": differ("off/1", f"off/{batch}"),
            "fixed_1_vs_fixed_batch": differ(f"{fixed}/1", f"{fixed}/{batch}"),
            "off_vs_fixed_at_1": differ("off/1", f"{fixed}/1"),
            "off_vs_fixed_at_batch": differ(f"off/{batch}", f"{fixed}/{batch}"),
            "rows": []}


# What each variant of the batch-invariant mode keeps of the default path (run_causes).
INVARIANCE_VARIANTS = {
    # The linears alone (RowTiledLinear); prompts attended as prefill chunks (SDPA over the
    # chunk, a gathered cached prefix); decode-only steps on the fused C layers, mixed steps
    # on the eager ones: the batch-invariant mode before every token took the decode path.
    "linears": {"all_decode_path": False, "fused": True},
    # ... and every step on the eager layers (no fused ones): isolates the fused/eager mix.
    "linears+eager": {"all_decode_path": False, "fused": False},
    # ModelConfig.batch_invariant as it is: every token attended by the decode kernel, one
    # query row at a time over its context; every step decode-only, so every row runs the
    # same (fused) layers.
    "invariant": {"all_decode_path": True, "fused": True},
}


def run_causes(args: argparse.Namespace) -> dict[str, Any]:
    """Why greedy outputs with speculation differ from those without in batches: the same
    closed loops (off, fixed K, adaptive; and off at 1 seat) under each of
    INVARIANCE_VARIANTS, outputs that differ from off's counted per variant; and, per
    variant, whether a prompt's last-token logits are bit for bit the same when it is
    prefilled in one chunk, in chunks of 16 tokens, and after its first 32 tokens came from
    another request's cached blocks. A count, not a time: run it under `cpu`."""
    import torch

    from heddle.config import ModelConfig
    from heddle.model.executor import ModelExecutor, _RequestState, _Row

    args.batch_invariant = True
    cache = CacheConfig(block_size=16, num_blocks=args.num_blocks)
    executor = ModelExecutor(ModelConfig(batch_invariant=True), cache)
    tokenizer = executor.tokenizer
    assert tokenizer is not None
    configs = speculation_configs("ngram", args.k)
    out: dict[str, Any] = {}

    def set_variant(variant: str) -> None:
        v = INVARIANCE_VARIANTS[variant]
        executor.batch_invariant = bool(v["all_decode_path"])
        executor.model.fused_enabled = bool(v["fused"])

    def last_logits(prompt: list[int], chunks: list[int], table: list[int]) -> torch.Tensor:
        state = _RequestState(list(prompt), len(prompt), table, SamplingParams(temperature=0.0),
                              None)
        start = 0
        logits = None
        with torch.inference_mode():
            for n in chunks:
                last = start + n == len(prompt)
                _, logits = executor._forward(
                    [_Row("p", prompt[start:start + n], start, last, state)])
                start += n
        assert logits is not None
        return logits[-1]

    prompt = real_prompts(tokenizer, "repetitive", 1)[0][:120]
    blocks = (len(prompt) + 15) // 16
    for variant in INVARIANCE_VARIANTS:
        set_variant(variant)
        whole = last_logits(prompt, [len(prompt)], list(range(blocks)))
        chunked = last_logits(prompt, [16] * (len(prompt) // 16) + [len(prompt) % 16],
                              list(range(blocks, 2 * blocks)))
        # Blocks 0-1 hold the first 32 tokens' K/V from the whole prefill above: a cache hit.
        table = [0, 1, *range(2 * blocks, 3 * blocks - 2)]
        state = _RequestState(list(prompt), len(prompt), table, SamplingParams(temperature=0.0),
                              None)
        with torch.inference_mode():
            _, hit = executor._forward([_Row("p", prompt[32:], 32, True, state)])
        # The prompt's next token decoded (a decode-only step: fused layers where enabled)
        # against the same row beside a prefill chunk (a mixed step: eager layers unless every
        # token takes the decode path).
        token = int(whole.argmax())
        state = _RequestState([*prompt, token], len(prompt) + 1, list(range(blocks + 1)),
                              SamplingParams(temperature=0.0), None)
        other = _RequestState(list(prompt), len(prompt), list(range(3 * blocks, 4 * blocks)),
                              SamplingParams(temperature=0.0), None)
        with torch.inference_mode():
            _, alone = executor._forward([_Row("d", [token], len(prompt), True, state)])
            ordered, mixed = executor._forward([_Row("d", [token], len(prompt), True, state),
                                                _Row("o", prompt[:40], 0, True, other)])
        mixed_row = mixed[[r.request_id for r in ordered].index("d")]
        out.setdefault("prefill", {})[variant] = {
            "decode_alone_vs_beside_a_prefill": bool(torch.equal(alone[0], mixed_row)),
            "chunks_of_16_vs_whole": bool(torch.equal(chunked, whole)),
            "prefix_cache_hit_vs_whole": bool(torch.equal(hit[-1], whole)),
            "max_abs_logit_difference": float(max((chunked - whole).abs().max(),
                                                  (hit[-1] - whole).abs().max())),
        }
        print(f"  {variant}: prefill {out['prefill'][variant]}", flush=True)
    counts: dict[str, Any] = {}
    for streams in args.streams:
        num = max(args.requests, args.per_stream * streams)
        prompts = real_prompts(tokenizer, args.workload, num)
        params = output_params(args, num)
        for variant in INVARIANCE_VARIANTS:
            set_variant(variant)
            outputs: dict[str, dict[str, list[int]]] = {}
            for name, spec, seats in [(n, s, streams) for n, s in configs.items()] + [
                    ("off@1", configs["off"], 1)]:
                engine = make_engine(executor, executor, cache, args.budget, seats, spec)
                outputs[name] = closed_loop(engine, prompts, params, seats, time.perf_counter,
                                            prefix=f"{streams}-{variant}-{name}-")["outputs"]
                if engine.kv_cache.num_free_blocks != engine.kv_cache.num_blocks:
                    raise RuntimeError("KV blocks left behind")
            row = {name: sum(outputs[name][key] != outputs["off"][key] for key in outputs["off"])
                   for name in outputs if name != "off"}
            row["outputs"] = num
            counts.setdefault(str(streams), {})[variant] = row
            print(f"  streams={streams} {variant}: differ from off {row}", flush=True)
    set_variant("invariant")
    return {"mode": "invariance-causes", "workload": args.workload, "k": args.k,
            "output_len": args.output_len, "vary_len": args.vary_len, "streams": args.streams,
            "quantization": executor.quantization, "threads": torch.get_num_threads(),
            "variants": INVARIANCE_VARIANTS, "differ_from_off": counts, "rows": [], **out}


def run_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Where a real run's time went, per streams, round and mode, from its saved result and
    step log (results/speculation_real_{workload}{tag}.json; no model is run): steps, steps
    with fewer rows than streams (a run's start and its drain, when fewer requests are left
    than streams), the executor's seconds, the host's (the run's wall time less the executor's,
    per step), the median step of `streams` rows without drafts, and the steps with drafts.
    A run starts at a step that prefills `streams` whole prompts and decodes nothing."""
    from heddle.model.step_log import load_steps

    result = json.loads(Path(f"results/speculation_real_{args.workload}{args.tag}.json")
                        .read_text())
    steps, _ = load_steps(result["steps_log"])
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    streams_list = list(dict.fromkeys(r["streams"] for r in result["rows"]))
    runs: list[list[Any]] = []
    for shape, seconds in steps:
        prompts = shape.prefill_chunks
        if not shape.num_decode_tokens and prompts and all(new == context and new > 16
                                                           for new, context in prompts):
            runs.append([])
        runs[-1].append((shape, seconds))
    if len(runs) != len(streams_list) * result["repeats"] * len(modes):
        raise SystemExit(f"{len(runs)} runs in the step log, expected "
                         f"{len(streams_list)} x {result['repeats']} x {len(modes)}")
    by = {(r["streams"], r["mode"]): r for r in result["rows"]}
    out: list[dict[str, Any]] = []
    index = 0
    for streams in streams_list:
        for repeat in range(result["repeats"]):
            for mode in modes:
                run = runs[index]
                index += 1
                row = by[(streams, mode)]
                # Results saved before output_tokens_runs: only the first round's count.
                tokens = row.get("output_tokens_runs", [row["output_tokens"]])
                if repeat >= len(tokens):
                    continue
                tokens_run = tokens[repeat]
                wall = tokens_run / row["tokens_per_second_runs"][repeat]
                executor = sum(seconds for _, seconds in run)
                # A verify row is a short chunk past the prompt (its token and drafts).
                verify = [(sh, t) for sh, t in run if any(new <= 17 and context > new
                                                          for new, context in sh.prefill_chunks)]
                full = [t for sh, t in run if sh.num_decode_tokens == streams
                        and not sh.prefill_chunks]
                rows_of = [sh.num_decode_tokens + len(sh.prefill_chunks) for sh, _ in run]
                out.append({"streams": streams, "round": repeat, "mode": mode,
                            "steps": len(run), "output_tokens": tokens_run,
                            "steps_below_streams": sum(r < streams for r in rows_of),
                            "executor_seconds": executor,
                            "executor_ms_per_token": 1000 * executor / tokens_run,
                            "host_ms_per_step": 1000 * (wall - executor) / len(run),
                            "full_step_ms": 1000 * statistics.median(full) if full else None,
                            "steps_with_drafts": len(verify)})
                o = out[-1]
                print(f"  streams={streams} #{repeat} {mode}: {o['steps']} steps "
                      f"({o['steps_below_streams']} below {streams} rows, "
                      f"{o['steps_with_drafts']} with drafts), {o['output_tokens']} tokens, "
                      f"executor {executor:.2f} s ({o['executor_ms_per_token']:.2f} ms/token), host {o['host_ms_per_step']:.2f} ms/step, "
                      f"full step {o['full_step_ms'] or 0:.1f} ms", flush=True)
    return {"mode": "steps", "workload": args.workload, "tag": args.tag, "runs": out,
            "greedy_mismatches_by_streams": result.get("greedy_mismatches_by_streams"),
            "rows": []}


class _DraftSteps:
    """An executor that forwards to `executor` and counts the steps that verify drafts."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.steps_with_drafts = 0

    def execute(self, scheduler_output: Any) -> Any:
        self.steps_with_drafts += bool(scheduler_output.draft_token_ids)
        return self.executor.execute(scheduler_output)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executor, name)


def run_invariant_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Speculation on identical work, and what the batch-invariant mode costs: the same closed
    loops on two executors of the embedded model, the default one and one with
    ModelConfig.batch_invariant, for each of `--cost-runs` (executor/mode pairs, default
    default/off, invariant/off, invariant/adaptive), interleaved round by round. Per streams:
    tok/s per run, the medians of the ratios paired within each round (invariant adaptive /
    invariant off: speculation alone, the outputs being identical; invariant off / default
    off: the mode's cost), the output tokens, steps, drafts and executor seconds of every run,
    and the outputs of every run that differ from invariant/off's first round (each round and
    mode counted: in the invariant mode 0 is expected)."""
    import torch

    from heddle.config import ModelConfig
    from heddle.model.executor import ModelExecutor
    from heddle.model.step_log import StepRecorder

    configs = speculation_configs("ngram", args.k)
    for run_name in args.cost_runs:
        name, _, mode = run_name.partition("/")
        if name not in ("default", "invariant") or mode not in configs:
            raise SystemExit(f"--cost-runs: {run_name!r} is not EXECUTOR/MODE with EXECUTOR "
                             f"default or invariant and MODE one of {', '.join(configs)}")
    cache = CacheConfig(block_size=16, num_blocks=args.num_blocks)
    names = sorted({run.split("/")[0] for run in args.cost_runs})
    models = {name: ModelExecutor(ModelConfig(batch_invariant=name == "invariant"), cache)
              for name in names}
    recorders = {name: StepRecorder(model) for name, model in models.items()}
    tokenizer = next(iter(models.values())).tokenizer
    warm = real_prompts(tokenizer, args.workload, 2)
    for run_name in args.cost_runs:
        name, mode = run_name.split("/")
        engine = make_engine(recorders[name], models[name], cache, args.budget, 2,
                             configs[mode])
        closed_loop(engine, warm, SamplingParams(temperature=0.0,
                                                 max_tokens=args.warmup_tokens), 2,
                    time.perf_counter, prefix="warm-")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    reference_run = "invariant/off" if "invariant/off" in args.cost_runs else args.cost_runs[0]
    points = args.points or [(streams, args.per_stream) for streams in args.streams]
    for streams, per_stream in points:
        num = max(args.requests, per_stream * streams)
        prompts = real_prompts(tokenizer, args.workload, num)
        params = output_params(args, num)
        runs: dict[str, list[dict[str, Any]]] = {run_name: [] for run_name in args.cost_runs}
        reference: dict[str, list[int]] | None = None
        for repeat in range(args.repeats):
            order = list(args.cost_runs) if repeat == 0 else (
                args.cost_runs[repeat % len(args.cost_runs):]
                + args.cost_runs[:repeat % len(args.cost_runs)])
            if repeat == 0:  # the reference first
                order.remove(reference_run)
                order.insert(0, reference_run)
            for run_name in order:
                name, mode = run_name.split("/")
                recorder = recorders[name]
                recorder.steps.clear()
                counter = _DraftSteps(recorder)
                engine = make_engine(counter, models[name], cache, args.budget, streams,
                                     configs[mode])
                run = closed_loop(engine, prompts, params, streams, time.perf_counter,
                                  prefix=f"{streams}-{run_name}-{repeat}-")
                outputs = run.pop("outputs")
                run.pop("per_request")
                if reference is None:
                    reference = outputs
                run["differ_from_reference"] = sum(outputs[key] != reference[key]
                                                   for key in reference)
                run["executor_seconds"] = sum(seconds for _, seconds in recorder.steps)
                run["steps_with_drafts"] = counter.steps_with_drafts
                run["round"] = repeat
                if engine.scheduler.speculator is not None:
                    run["steps_skipped"] = engine.scheduler.speculator.num_steps_skipped
                runs[run_name].append(run)
                print(f"  streams={streams} {run_name} #{repeat}: "
                      f"{run['tokens_per_second']:.1f} tok/s, {run['output_tokens']} tokens, "
                      f"{run['steps']} steps, {run['drafted']} drafted "
                      f"({run['steps_with_drafts']} steps), differ "
                      f"{run['differ_from_reference']}, executor "
                      f"{run['executor_seconds']:.2f} s "
                      f"({time.perf_counter() - started:.0f} s so far)", flush=True)

        def paired(a: str, b: str, runs: dict[str, list[dict[str, Any]]] = runs) -> Any:
            if a not in runs or b not in runs:
                return None
            ratios = [x["tokens_per_second"] / y["tokens_per_second"]
                      for x, y in zip(runs[a], runs[b], strict=True)]
            return {"median": statistics.median(ratios), "rounds": ratios}

        row = {
            "streams": streams, "per_stream": per_stream, "requests": num,
            "tokens_per_second": {k: statistics.median(r["tokens_per_second"] for r in v)
                                  for k, v in runs.items()},
            "adaptive_over_off_invariant": paired("invariant/adaptive", "invariant/off"),
            "fixed_over_off_invariant": paired(f"invariant/fixed-k{args.k}", "invariant/off"),
            "adaptive_over_off_default": paired("default/adaptive", "default/off"),
            "invariant_over_default_off": paired("invariant/off", "default/off"),
            "differ_from_reference": {k: sum(r["differ_from_reference"] for r in v)
                                      for k, v in runs.items()},
            "compared": num * args.repeats, "reference": reference_run,
            "runs": runs,
        }
        rows.append(row)
        summary = {k: v for k, v in row.items() if k != "runs"}
        print(json.dumps(summary), flush=True)
        Path("results").mkdir(exist_ok=True)
        Path(f"results/speculation_invariant_cost_{args.workload}{args.tag}.partial.json"
             ).write_text(json.dumps({"cost_rows": rows}))
    model = next(iter(models.values()))
    return {"mode": "invariant-cost", "workload": args.workload, "repeats": args.repeats,
            "output_len": args.output_len, "vary_len": args.vary_len, "k": args.k,
            "cost_runs": args.cost_runs, "cost_rows": rows, "rows": [],
            "quantization": {name: m.quantization for name, m in models.items()},
            "threads": torch.get_num_threads(), "model": model.model_name,
            "wall_seconds": time.perf_counter() - started}


def run_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """Which linear kernels give a row the result it gets alone (a 1-row call), at each row
    count of a call: per layer kind of the embedded model (decoder layer 3 and the LM head),
    per path (the quantized kernel, the float path, the float path in 32-row calls as
    ModelConfig.batch_invariant runs it), the rows of an M-row call of random bf16 inputs
    whose outputs differ from their 1-row results in any bit; and how far the quantized and
    float paths are apart on the same rows (what a kernel switch by row count changes). A
    count, not a time: run it under `cpu`."""
    import torch

    from heddle.model.batch_invariant import RowTiledLinear
    from heddle.model.linear_plan import DispatchLinear, kernel_name

    model_executor, _, _ = real_engine(args)
    model = model_executor.model
    layer = model.layers[3]
    kinds = {"qkv": layer.qkv_proj, "o": layer.o_proj, "gate_up": layer.gate_up_proj,
             "down": layer.down_proj, "lm_head": model.lm_head}
    torch.manual_seed(0)
    most = max(args.rows)
    out: list[dict[str, Any]] = []
    for kind, linear in kinds.items():
        paths: dict[str, Any] = {}
        if isinstance(linear, DispatchLinear):
            if linear.small is not None:
                paths[kernel_name(linear)] = linear.small
            if linear.large is not None:
                paths["bf16"] = linear.large
        else:
            paths["bf16"] = linear
        paths["bf16, 32-row calls"] = RowTiledLinear(linear)
        x = torch.randn(most, linear.in_features).to(model_executor.dtype)
        alone = {}
        with torch.inference_mode():
            for name, fn in paths.items():
                alone[name] = torch.cat([fn(x[i : i + 1]) for i in range(most)])
                differ = {m: int((fn(x[:m]) != alone[name][:m]).any(dim=1).sum())
                          for m in args.rows}
                out.append({"kind": kind, "path": name, "rows_differing": differ,
                            "max_rows": getattr(linear, "max_rows", None)})
                print(f"  {kind} {name}: {differ}", flush=True)
        quantized = [n for n in paths if n in ("int4", "int8", "int8g")]
        if quantized:
            a, b = alone[quantized[0]].float(), alone["bf16"].float()
            out.append({"kind": kind, "path": f"{quantized[0]} vs bf16",
                        "elements_differing": float((a != b).float().mean()),
                        "max_abs_difference": float((a - b).abs().max())})
    return {"mode": "kernels", "quantization": model_executor.quantization,
            "threads": torch.get_num_threads(), "kernels": out, "rows": []}


def table(rows: list[dict[str, Any]]) -> str:
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    others = [m for m in modes if m != "off"]
    lines = ["| streams | " + " | ".join(f"{m} tok/s" for m in modes)
             + "".join(f" | {m} / off" for m in others) + " | acceptance (adaptive) |",
             "|---" * (len(modes) + len(others) + 2) + "|"]
    for streams in dict.fromkeys(r["streams"] for r in rows):
        by = {r["mode"]: r for r in rows if r["streams"] == streams}
        off = by["off"]["tokens_per_second"]
        acc = by["adaptive"]["acceptance"]

        def ratio(row: dict[str, Any], off: float = off) -> float:
            # Real runs: the median of the ratios paired within each interleaved round.
            return float(row.get("ratio_to_off", row["tokens_per_second"] / off))

        lines.append(
            f"| {streams} | " + " | ".join(f"{by[m]['tokens_per_second']:.1f}" for m in modes)
            + "".join(f" | {ratio(by[m]):.3f}" for m in others)
            + f" | {'-' if acc is None else f'{acc:.2f}'} |"
        )
    return "\n".join(lines)


def cost_table(rows: list[dict[str, Any]]) -> str:
    """invariant-cost: a markdown table per point (medians, the paired ratios of each round,
    and per run name the output tokens, steps, steps with drafts, executor ms per output token
    and host ms per step of its rounds, medians)."""
    def fmt(ratio: dict[str, Any] | None) -> str:
        if ratio is None:
            return "-"
        return f"**{ratio['median']:.3f}** ({', '.join(f'{r:.3f}' for r in ratio['rounds'])})"

    lines = ["| streams x requests | invariant adaptive / off (rounds) | invariant off / default "
             "off (rounds) | outputs differing from invariant off |",
             "|---|---|---|---|"]
    for row in rows:
        differ = ", ".join(f"{k} {v}" for k, v in row["differ_from_reference"].items())
        lines.append(f"| {row['streams']} x {row['requests']} | "
                     f"{fmt(row['adaptive_over_off_invariant'])} | "
                     f"{fmt(row['invariant_over_default_off'])} | {differ} of "
                     f"{row['compared']} each |")
    lines += ["", "| streams x requests | run | tok/s | output tokens | steps | steps with "
              "drafts | drafted / accepted | executor ms / token | host ms / step |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for name, runs in row["runs"].items():
            def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r[key] for r in runs)

            per_token = statistics.median(1000 * r["executor_seconds"] / r["output_tokens"]
                                          for r in runs)
            host = statistics.median(1000 * (r["seconds"] - r["executor_seconds"]) / r["steps"]
                                     for r in runs)
            lines.append(f"| {row['streams']} x {row['requests']} | {name} | "
                         f"{med('tokens_per_second'):.1f} | {med('output_tokens'):.0f} | "
                         f"{med('steps'):.0f} | {med('steps_with_drafts'):.0f} | "
                         f"{med('drafted'):.0f} / {med('accepted'):.0f} | {per_token:.2f} | "
                         f"{host:.2f} |")
    return "\n".join(lines)


def _points(text: str) -> list[tuple[int, int]]:
    """STREAMS:PER_STREAM,... (e.g. 4:3,4:6)."""
    points = []
    for item in text.split(","):
        streams, sep, per_stream = item.partition(":")
        if not sep or not streams.isdigit() or not per_stream.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not STREAMS:PER_STREAM")
        points.append((int(streams), int(per_stream)))
    return points


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["sim", "real", "fit", "invariance", "kernels",
                                         "invariant-cost", "invariance-causes", "steps"])
    parser.add_argument("--streams", type=_ints, default=[1, 4, 16, 64])
    parser.add_argument("--k", type=int, default=4, help="the most drafts per request and step")
    parser.add_argument("--requests", type=int, default=8, help="at least this many requests")
    parser.add_argument("--per-stream", type=int, default=1,
                        help="real: at least this many requests per stream")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=256, help="sim only")
    parser.add_argument("--budget", type=int, default=None,
                        help="token budget per step (default: 8192 sim, 512 real)")
    parser.add_argument("--workload", choices=["repetitive", "chat"], default="repetitive")
    parser.add_argument("--repeats", type=int, default=1,
                        help="real: interleaved repeats of every mode (medians reported)")
    parser.add_argument("--tag", default="", help="real, fit: a suffix of the result files")
    parser.add_argument("--warmup-tokens", type=int, default=16,
                        help="real: output tokens of each untimed warm-up request")
    parser.add_argument("--verify-kernels", choices=["decode", "rows", "both"],
                        default="decode",
                        help="real: verify rows run the linear kernels of the step without "
                        "drafts (decode), of their row count (rows), or both as extra modes")
    parser.add_argument("--dispatch-rows", type=_ints, default=[],
                        help="fit: kernel-switch rows, for a result saved without them")
    parser.add_argument("--batch", type=int, default=16, help="invariance: prompts at once")
    parser.add_argument("--vary-len", type=_ints, default=None,
                        help="real: LOW,HIGH: each request's max_tokens uniform in LOW..HIGH")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="real, invariance: the engine's batch-invariant linears "
                        "(ModelConfig.batch_invariant)")
    parser.add_argument("--rows", type=_ints, default=[1, 2, 4, 5, 8, 16, 17, 32, 33, 64, 80],
                        help="kernels: the row counts of each call")
    parser.add_argument("--num-blocks", type=int, default=1280, help="real: the KV pool")
    parser.add_argument("--points", type=_points, default=None,
                        help="invariant-cost: STREAMS:PER_STREAM points, in this order "
                        "(instead of --streams and --per-stream)")
    parser.add_argument("--cost-runs", type=lambda t: t.split(","),
                        default=["default/off", "invariant/off", "invariant/adaptive"],
                        help="invariant-cost: EXECUTOR/MODE runs, EXECUTOR default or "
                        "invariant, MODE off, fixed-kK or adaptive")
    parser.add_argument("--sim-streams", type=_ints, default=[1, 2, 4, 8, 16, 32, 64],
                        help="real: the streams of the simulator fitted to the run")
    parser.add_argument("--model", default="llama-3.1-8b", help="sim only")
    parser.add_argument("--hardware", default="h100", help="sim only")
    parser.add_argument("--acceptance", type=float, default=0.75, help="sim only")
    parser.add_argument("--spread", type=float, default=0.2, help="sim only")
    parser.add_argument("--measured", choices=["repetitive", "chat"], default=None,
                        help="sim: the acceptance, spread and proposal rate measured on the real "
                        "engine for this workload (heddle/spec/sim.py MEASURED_ACCEPTANCE)")
    args = parser.parse_args()
    if args.budget is None:
        args.budget = 8192 if args.mode == "sim" else 512
    run = {"sim": run_sim, "real": run_real, "fit": run_fit, "invariance": run_invariance,
           "kernels": run_kernels, "invariant-cost": run_invariant_cost,
           "invariance-causes": run_causes, "steps": run_steps}
    started_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"started {started_utc}; machine: {machine_line()}", flush=True)
    result = run[args.mode](args)
    model, flags = cpuinfo()
    result["machine"] = machine_line()
    result["utc"] = f"{started_utc} .. {time.strftime('%H:%M:%S UTC', time.gmtime())}"
    summary = {k: v for k, v in result.items()
               if k not in ("rows", "sim_rows", "lengths", "lookup")}
    print(f"\n{args.mode}: {json.dumps(summary)}")
    print(f"host: {model}; {platform.machine()}; flags: {flags}")
    print(f"machine: {result['machine']}")
    if result.get("lookup"):
        print(f"prompt lookup along the outputs: {json.dumps(result['lookup'])}")
    if result["rows"]:
        print(table(result["rows"]))
    if result.get("cost_rows"):
        print(cost_table(result["cost_rows"]))
    if result.get("sim_rows"):
        print("\nthe simulator fitted to this run (profiled cost model, acceptance "
              f"{result['fitted']['acceptance']:.3f} +- {result['fitted']['spread']:.3f}, "
              f"proposals in {100 * result['fitted']['proposal_rate']:.1f}% of decode steps):")
        print(table(result["sim_rows"]))
        print(f"\nfixed K stops paying at {result['crossover_measured']} streams measured, "
              f"{result['crossover_simulated']} simulated")
    Path("results").mkdir(exist_ok=True)
    name = {"sim": "sim", "invariance": f"invariance_{args.workload}{args.tag}",
            "kernels": f"kernels{args.tag}",
            "invariant-cost": f"invariant_cost_{args.workload}{args.tag}",
            "invariance-causes": f"invariance_causes_{args.workload}{args.tag}",
            "steps": f"steps_{args.workload}{args.tag}"}.get(
        args.mode, f"real_{args.workload}{args.tag}")
    Path(f"results/speculation_{name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
