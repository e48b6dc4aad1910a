"""Batch-invariant linears: each row computes what it would alone, whatever else is in the step.

Greedy speculation is exact only if a verify row computes what a decode of the same token
computes. In a batch that needs more than the verify step: a run with speculation advances its
requests at other speeds than a run without, so a token is computed in steps of other sizes
and with other neighbours, and a row's logits must not depend on them. On the CPU path two
things make them depend (`benchmarks/speculation.py kernels` measures both per kernel):

- quantization auto picks a layer's kernel by the step's row count (int4 at up to 4-8 rows,
  bf16 above): the same row gets int4 rounding in a small step and bf16 rounding in a big one;
- oneDNN's bf16 matmul gives a row the result it gets alone only in calls of at most 32 rows
  (above, it changes its blocking, and some rows round differently).

`make_batch_invariant` replaces every linear of a network by a `RowTiledLinear`: one kernel for
every row count (the float path where a layer has one), called on at most ROW_TILE rows at a
time. With `ModelConfig.batch_invariant` the executor also puts every token of a step on the
decode path (ModelExecutor._on_decode_path): each token, prefill chunks included, is attended
by the C decode kernel over its context up to itself, one query row and KV head at a time in
a fixed order, instead of SDPA over its chunk (whose rounding depends on the chunk's length
and on whether its prefix came from the cache: 0.6 apart in the logits,
`benchmarks/speculation.py invariance-causes`). Every step is then decode-only, so every row
runs the same layers (the fused C ones where the model has them), and with the per-row C norms
a token's hidden states depend only on the tokens before it. It costs the quantized kernels'
speed at few rows, a call per 32 rows and a prefill attended one query at a time
(docs/SPECULATION.md); it needs the C decode kernel (a CPU float32 / bf16 model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from heddle.model.linear_plan import DispatchLinear, LinearLayer

if TYPE_CHECKING:
    from heddle.model.llama import LlamaForCausalLM

# Rows per matmul call: oneDNN's bf16 matmul gave every row of a call of up to 32 rows the
# result it gets alone (benchmarks/speculation.py kernels, every layer kind of SmolLM2).
ROW_TILE = 32


class RowTiledLinear:
    """`layer`'s float path (its only path if it has one kernel), called on at most `tile`
    rows at a time. x: [M, in_features] -> [M, out_features]."""

    __slots__ = ("bias", "dtype", "fn", "in_features", "out_features", "tile")

    def __init__(self, layer: LinearLayer, tile: int = ROW_TILE) -> None:
        if tile < 1:
            raise ValueError("tile must be at least 1 row")
        self.bias: torch.Tensor | None = None
        fn: LinearLayer = layer
        if isinstance(layer, DispatchLinear):
            # The float path where there is one (its bias added here: DispatchLinear adds its
            # bias to the quantized kernel's output only), else the quantized kernel alone.
            inner = layer.large if layer.large is not None else layer.small
            assert inner is not None
            fn, self.bias = inner, layer.bias
        self.fn = fn
        self.dtype = getattr(fn, "dtype", torch.float32)  # what its weight bytes are counted in
        self.tile = tile
        self.in_features, self.out_features = layer.in_features, layer.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows <= self.tile:
            y = self.fn(x)
        else:
            y = torch.cat([self.fn(x[i : i + self.tile]) for i in range(0, rows, self.tile)])
        return y if self.bias is None else y + self.bias


def make_batch_invariant(model: LlamaForCausalLM, tile: int = ROW_TILE) -> None:
    """Every projection and the LM head of `model` as a RowTiledLinear (once)."""
    for layer in model.layers:
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            linear = getattr(layer, name)
            if not isinstance(linear, RowTiledLinear):
                setattr(layer, name, RowTiledLinear(linear, tile))
    if not isinstance(model.lm_head, RowTiledLinear):
        model.lm_head = RowTiledLinear(model.lm_head, tile)
