"""What a verify step costs against a plain decode step at batch 1, and where the extra goes.

One request (the `repetitive` workload's prompt of benchmarks/speculation.py, its prompt
prefilled) on the real engine (embedded SmolLM2-135M, `--quantization auto`); then, at its next
position, interleaved repeats of:

- `decode`: one token (the decode kernels: the C paged attention, the row-count-1 linear plan);
- `verify-kK/prefill`: the known token and K drafts as one prefill chunk (SDPA over the gathered
  context; the path before issue 15's third pass);
- `verify-kK/decode-rows`: the same K + 1 tokens as K + 1 decode rows sharing the request's
  block table (the C decode attention), the linears' kernels chosen by the K + 1 rows;
- `verify-kK/decode`: the same, with the kernels the step would run without its drafts (the
  1-row plan: the path the executor takes now);

each timed as the executor's whole step (`_run`: network, LM head over the sampled rows,
verification or sampling), and broken down: the decoder stack alone (`forward`), the LM head
over 1 vs K + 1 rows (`logits`), the linears alone at 1 vs K + 1 rows (every layer of every
kind, as the step's row count dispatches them: `linears`), the greedy verification
(`verify`), the one-row sampler (`sample`), the attention metadata (`metadata`) and the
prompt-lookup proposal (`propose`, the scheduler side, per call on the request's tokens).
Medians over `--repeats` interleaved rounds (variants side by side in each round), ms.

    python benchmarks/spec_verify_step.py --repeats 30     # untimed smoke: --repeats 3

Writes results/spec_verify_step.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from heddle.config import CacheConfig, EngineConfig
from heddle.hostinfo import cpuinfo
from heddle.model.executor import ModelExecutor, _RequestState, _Row
from heddle.model.linear_plan import DispatchLinear
from heddle.model.sampler import SamplingRow
from heddle.request import SamplingParams
from heddle.spec.ngram import NgramProposer
from heddle.spec.rejection import verify

PATHS = ("prefill", "decode-rows", "decode")


class _NoMasks:
    token_masks = None


def _median_ms(fn: Callable[[], Any], times: list[float]) -> None:
    start = time.perf_counter()
    fn()
    times.append((time.perf_counter() - start) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--ks", default="1,2,4")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from speculation import real_prompts

    executor = ModelExecutor(EngineConfig().model, CacheConfig(block_size=16, num_blocks=64))
    assert executor.tokenizer is not None
    prompt = real_prompts(executor.tokenizer, "repetitive", 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=64)
    table = list(range(1 + (len(prompt) + 32) // 16))
    model = executor.model

    def state() -> _RequestState:
        return _RequestState(list(prompt), len(prompt), table, params, executor.eos_token_id)

    with torch.inference_mode():
        executor._forward([_Row("r", list(prompt[:-1]), 0, False, state())])
    position = len(prompt) - 1
    # Drafts: the prompt's own continuation of its last token (what lookup would propose).
    drafts = prompt[-5:-1]

    def configure(path: str) -> None:
        # "prefill": the chunk path and the row count's kernels (before); "decode-rows": the
        # decode attention, the row count's kernels; "decode": the decode attention and the
        # kernels of the step without its drafts (now).
        executor.verify_on_decode_path = path != "prefill"
        executor.verify_kernels_as_decode = path == "decode"

    def step(k: int, path: str) -> Callable[[], Any]:
        def run() -> Any:
            configure(path)
            row = _Row("r", [prompt[-1], *drafts[:k]], position, True, state(), k)
            return executor._run([row], _NoMasks())  # type: ignore[arg-type]
        return run

    def forward(k: int, path: str) -> Callable[[], Any]:
        def run() -> Any:
            configure(path)
            row = _Row("r", [prompt[-1], *drafts[:k]], position, False, state(), k)
            return executor._forward([row])
        return run

    hidden = torch.randn(max(ks) + 1, executor.spec.hidden_size, dtype=executor.dtype)
    linears = [layer for layer in model.linears.built]
    plain = [fn for layer in model.layers
             for fn in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
    inputs = {rows: {id(fn): torch.randn(rows, fn.in_features, dtype=executor.dtype)
                     for fn in plain} for rows in [1, *(k + 1 for k in ks)]}

    def linear_pass(rows: int) -> Callable[[], Any]:
        def run() -> Any:
            for fn in plain:
                fn(inputs[rows][id(fn)])
        return run

    def as_decode(fn: Callable[[], Any], k: int) -> Callable[[], Any]:
        def run() -> Any:
            executor.verify_kernels_as_decode = True
            with executor._kernels_without_drafts(k + 1, k):
                return fn()
        return run

    logits_k = {k: torch.randn(k + 1, executor.spec.vocab_size) for k in ks}
    proposer = NgramProposer(2, 4)
    tokens = list(prompt)
    proposer.propose("p", tokens, 4)

    variants: dict[str, Callable[[], Any]] = {
        "step decode": step(0, "decode"),
        "forward decode": forward(0, "decode"),
        "logits 1 row": lambda: model.compute_logits(hidden[:1]),
        "linears 1 row": linear_pass(1),
        "sample 1 row": lambda: executor.sampler.sample(
            logits_k[ks[0]][:1], [SamplingRow("s", params, 0, executor.eos_token_id)]),
        "propose": lambda: proposer.propose("p", tokens, 4),
    }
    for k in ks:
        for path in PATHS:
            variants[f"step verify-k{k}/{path}"] = step(k, path)
            variants[f"forward verify-k{k}/{path}"] = forward(k, path)
        variants[f"logits {k + 1} rows"] = (lambda n: lambda: model.compute_logits(
            hidden[:n]))(k + 1)
        variants[f"linears {k + 1} rows"] = linear_pass(k + 1)
        variants[f"linears {k + 1} rows, 1-row kernels"] = as_decode(linear_pass(k + 1), k)
        variants[f"logits {k + 1} rows, 1-row kernels"] = as_decode(
            (lambda n: lambda: model.compute_logits(hidden[:n]))(k + 1), k)
        variants[f"verify k{k}"] = (lambda kk: lambda: verify(
            logits_k[kk], drafts[:kk], params))(k)
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.inference_mode():
        for fn in variants.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in variants.items():
                _median_ms(fn, times[name])
    configure("decode")
    medians = {name: statistics.median(t) for name, t in times.items()}
    model_name, flags = cpuinfo()
    kernels = {layer.kind: layer.max_rows for layer in linears if isinstance(layer,
                                                                           DispatchLinear)}
    result = {"repeats": args.repeats, "prompt_tokens": len(prompt), "cpu": model_name,
              "flags": flags, "threads": torch.get_num_threads(),
              "quantization": executor.quantization, "kernel_rows": kernels,
              "median_ms": medians}
    print(f"{model_name}; {torch.get_num_threads()} threads; {executor.quantization}; "
          f"prompt {len(prompt)} tokens; medians of {args.repeats} interleaved rounds, ms")
    print("| what | ms | / decode step |")
    print("|---|---|---|")
    base = medians["step decode"]
    for name, value in medians.items():
        print(f"| {name} | {value:.3f} | {value / base:.2f} |")
    Path("results").mkdir(exist_ok=True)
    Path("results/spec_verify_step.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
