"""The linear layers of one decode step, per kernel and row count: where int4, int8 and bf16
cross over (issue 10's 8-stream dip).

    .venv/bin/python benchmarks/linear_rows.py [--rows 1 2 4 8 16 32] [--rounds 7] [--threads 2]

For each kind of projection (qkv, o, gate_up, down: all 30 layers of it, so the weights
stream from memory as in a real step; lm_head once) and each row count, one pass runs the kind
with each kernel: bf16 (the oneDNN prepacked float path), torch's int4 (`Int4Linear`, the
GGUF's own Q4_1 blocks), torch's int8 (`Int8Linear`, per channel) and int8 in groups of 32
(`GroupInt8Linear`, "int8g": what `--quantization int8` runs, the file's own numbers as 8-bit
codes; the LM head from the file's Q8_0 blocks). Passes are interleaved
over `rounds` rounds; medians. Prints the table per kind, the sum over kinds per kernel (the
step's matmul time if every layer ran that kernel) and the best kernel per kind.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from heddle.model.device import cpu_description
from heddle.model.layers import Linear
from heddle.model.loader import load_model
from heddle.model.quant import (
    BlockQuantized,
    GroupInt8Linear,
    Int4Linear,
    Int8Linear,
    quantize_int4_blocks,
    quantize_int8_blocks,
)

Layer = Callable[[torch.Tensor], torch.Tensor]
KERNELS = ("bf16", "int4", "int8", "int8g")


def _kinds(weights: dict[str, torch.Tensor], blocks: dict[str, BlockQuantized],
           num_layers: int) -> dict[str, list[tuple[torch.Tensor, BlockQuantized]]]:
    """kind -> per layer (float weight [N, K], its 4-bit blocks)."""
    parts = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
             "o": ["self_attn.o_proj"], "gate_up": ["mlp.gate_proj", "mlp.up_proj"],
             "down": ["mlp.down_proj"]}
    kinds: dict[str, list[tuple[torch.Tensor, BlockQuantized]]] = {}
    for kind, names in parts.items():
        for i in range(num_layers):
            keys = [f"model.layers.{i}.{name}.weight" for name in names]
            weight = torch.cat([weights[key] for key in keys])
            have = [blocks.get(key) for key in keys]
            four = (BlockQuantized.cat([b for b in have if b is not None])
                    if all(b is not None and b.bits == 4 for b in have) else None)
            kinds.setdefault(kind, []).append((weight, four or quantize_int4_blocks(weight)))
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    kinds["lm_head"] = [(head, quantize_int4_blocks(head))]
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(cpu_description())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    loaded = load_model(args.model, keep_blocks=True)
    kinds = _kinds(loaded.weights, loaded.blocks, loaded.spec.num_layers)
    layers: dict[str, dict[str, list[Layer]]] = {}
    head_blocks = loaded.blocks.get("model.embed_tokens.weight")
    for kind, per_layer in kinds.items():
        layers[kind] = {
            "bf16": [Linear(w.bfloat16()) for w, _ in per_layer],
            "int4": [Int4Linear(b, torch.bfloat16) for _, b in per_layer],
            "int8": [Int8Linear(w, torch.bfloat16) for w, _ in per_layer],
            "int8g": [GroupInt8Linear(b, torch.bfloat16) for _, b in per_layer],
        }
        if kind == "lm_head":
            head = per_layer[0][0]
            eight = (head_blocks if head_blocks is not None and head_blocks.bits == 8
                     else quantize_int8_blocks(head))
            layers[kind]["int8g"] = [GroupInt8Linear(eight, torch.bfloat16)]
    print("median ms per pass over every layer of a kind (lm_head: int4 is quantized at load "
          "here; auto keeps the file's 8 bits)")
    totals: dict[int, dict[str, float]] = {}
    best_total: dict[int, float] = {}
    with torch.inference_mode():
        for rows in args.rows:
            totals[rows] = dict.fromkeys(KERNELS, 0.0)
            best_total[rows] = 0.0
            for kind, by_kernel in layers.items():
                x = torch.randn(rows, by_kernel["bf16"][0].in_features).bfloat16()  # type: ignore[attr-defined]
                times: dict[str, list[float]] = {k: [] for k in KERNELS}
                for _ in range(args.rounds + 1):  # the first round warms up
                    for kernel in KERNELS:
                        start = time.perf_counter()
                        for layer in by_kernel[kernel]:
                            layer(x)
                        times[kernel].append(time.perf_counter() - start)
                medians = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
                for kernel in KERNELS:
                    totals[rows][kernel] += medians[kernel]
                best = min(medians, key=lambda k: medians[k])
                best_total[rows] += medians[best]
                print(f"rows {rows:>3} {kind:>8}: " + "  ".join(
                    f"{k} {medians[k]:7.3f}" for k in KERNELS) + f"   best {best}")
    print("\nsum over kinds (ms): rows | " + " | ".join(KERNELS) + " | best per kind")
    for rows in args.rows:
        t = totals[rows]
        print(f"| {rows} | " + " | ".join(f"{t[k]:.2f}" for k in KERNELS)
              + f" | {best_total[rows]:.2f} |")


if __name__ == "__main__":
    main()
