"""Weight-only quantized linear layers: GGUF blocks read exactly, int4/int8 kernels against a
dequantized reference, the builder's choices per mode, and the per-row-count dispatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from heddle.errors import HeddleError
from heddle.model.gguf_file import GGUFFile, block_quantized, dequantize
from heddle.model.layers import Linear
from heddle.model.linear_plan import (
    DispatchLinear,
    LinearBuilder,
    describe,
    linear_weight_bytes,
    tune_dispatch,
)
from heddle.model.quant import (
    BlockQuantized,
    GroupInt8Linear,
    Int4Linear,
    Int8Linear,
    quantize_int4_blocks,
    quantize_int8_blocks,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("ggml_type", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
                                       GGMLQuantizationType.Q8_0])
def test_gguf_blocks_dequantize_exactly_like_the_file(ggml_type):
    weight = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    data = np.ascontiguousarray(gguf_quantize(weight, ggml_type)).view(np.uint8).reshape(-1)
    blocks = block_quantized(data, ggml_type, (48, 96))
    assert blocks.bits == (8 if ggml_type == GGMLQuantizationType.Q8_0 else 4)
    assert torch.equal(blocks.dequantize(), dequantize(data, ggml_type, (48, 96)))


def test_embedded_model_blocks_match_its_dequantized_weights(gguf_path):
    gguf = GGUFFile(gguf_path)
    try:
        for name in ("blk.0.ffn_down.weight", "token_embd.weight"):  # Q4_1 and Q8_0
            blocks = gguf.blocks(name)
            assert blocks is not None
            assert torch.equal(blocks.dequantize(), gguf.tensor(name))
        assert gguf.blocks("blk.0.attn_norm.weight") is None  # F32
    finally:
        gguf.close()


def test_int4_linear_runs_the_blocks_own_numbers():
    torch.manual_seed(0)
    weight = torch.randn(64, 96)
    blocks = quantize_int4_blocks(weight)
    assert int(blocks.codes.max()) <= 15
    # The 4-bit grid is within half a step of the weight.
    step = blocks.scales.repeat_interleave(32, dim=1)
    assert ((blocks.dequantize() - weight).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(5, 96)
    reference = x @ blocks.dequantize().T
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        out = Int4Linear(blocks, dtype)(x.to(dtype))
        assert out.dtype == dtype and out.shape == (5, 64)
        torch.testing.assert_close(out.float(), reference, atol=tolerance * 10, rtol=tolerance)


def test_int8_linear_is_within_its_rounding():
    torch.manual_seed(1)
    weight = torch.randn(32, 64)
    layer = Int8Linear(weight, torch.float32)
    dequantized = layer.qweight.float() * layer.scales.unsqueeze(1)
    assert ((dequantized - weight).abs() <= layer.scales.unsqueeze(1) / 2 + 1e-6).all()
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), x @ dequantized.T, atol=1e-4, rtol=1e-4)
    assert layer.weight_bytes == 32 * 64 + 32 * 4


@pytest.mark.parametrize("ggml_type", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_group_int8_linear_computes_the_files_own_numbers(ggml_type):
    weight = np.random.default_rng(3).standard_normal((48, 96)).astype(np.float32)
    data = np.ascontiguousarray(gguf_quantize(weight, ggml_type)).view(np.uint8).reshape(-1)
    blocks = block_quantized(data, ggml_type, (48, 96))
    x = torch.randn(5, 96)
    exact = (x.double() @ blocks.dequantize().double().T)
    # float32: the file's numbers, to float32 rounding (per channel int8 is 100x off).
    out = GroupInt8Linear(blocks, torch.float32)(x)
    assert (out.double() - exact).abs().max() < 1e-5 * exact.abs().max()
    per_channel = Int8Linear(blocks.dequantize(), torch.float32)(x)
    assert (per_channel.double() - exact).abs().max() > 1e-3 * exact.abs().max()
    if ggml_type == GGMLQuantizationType.Q4_1:  # bf16: the same numbers as the int4 kernel
        torch.testing.assert_close(GroupInt8Linear(blocks, torch.bfloat16)(x.bfloat16()),
                                   Int4Linear(blocks, torch.bfloat16)(x.bfloat16()))
    layer = GroupInt8Linear(blocks, torch.bfloat16)
    assert layer.weight_bytes == 48 * 96 + (2 * 96 // 32) * 48 * 2 * 2


def test_int8_blocks_are_within_half_a_step():
    torch.manual_seed(4)
    weight = torch.randn(16, 64)
    blocks = quantize_int8_blocks(weight)
    assert blocks.bits == 8 and blocks.codes.dtype == torch.int8
    step = blocks.scales.repeat_interleave(32, dim=1)
    assert ((blocks.dequantize() - weight).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(3, 64)
    torch.testing.assert_close(GroupInt8Linear(blocks, torch.float32)(x),
                               x @ blocks.dequantize().T, atol=1e-4, rtol=1e-4)


def _file_blocks(weight: torch.Tensor) -> BlockQuantized:
    return quantize_int4_blocks(weight)


def test_builder_modes():
    torch.manual_seed(2)
    weights = [torch.randn(32, 64), torch.randn(16, 64)]
    names = ["a.weight", "b.weight"]
    blocks = {n: _file_blocks(w) for n, w in zip(names, weights, strict=True)}
    x = torch.randn(2, 64)

    none = LinearBuilder("none", torch.float32, CPU, dict(blocks)).build("qkv", names, weights)
    assert isinstance(none, Linear)
    torch.testing.assert_close(none(x), x @ torch.cat(weights).T, atol=1e-4, rtol=1e-4)

    # auto with the file's 4-bit blocks: int4 on the file's own numbers, plus the float path.
    auto = LinearBuilder("auto", torch.float32, CPU, dict(blocks)).build("qkv", names, weights)
    assert isinstance(auto, DispatchLinear)
    assert isinstance(auto.small, Int4Linear) and auto.large is not None
    exact = x @ torch.cat([blocks[n].dequantize() for n in names]).T
    torch.testing.assert_close(auto(x), exact, atol=1e-4, rtol=1e-4)

    # auto with an 8-bit (Q8_0) LM head: the grouped int8 on the file's numbers, and bf16.
    head_weight = torch.randn(48, 64)
    q8 = {"h": quantize_int8_blocks(head_weight)}
    auto_head = LinearBuilder("auto", torch.float32, CPU, q8).build("lm_head", ["h"],
                                                                      [head_weight])
    assert isinstance(auto_head, DispatchLinear) and auto_head.large is not None
    assert isinstance(auto_head.small, GroupInt8Linear)
    torch.testing.assert_close(auto_head(x), x @ q8["h"].dequantize().T, atol=1e-4, rtol=1e-4)

    # auto on a float checkpoint never quantizes.
    plain = LinearBuilder("auto", torch.float32, CPU, {})
    assert plain.mode == "none"
    assert isinstance(plain.build("qkv", names, weights), Linear)

    # int4: no float copy; the LM head stays 8-bit, in groups of 32.
    int4 = LinearBuilder("int4", torch.float32, CPU, {})
    layer = int4.build("gate_up", names, weights)
    assert isinstance(layer, DispatchLinear) and layer.large is None
    assert isinstance(layer.small, Int4Linear)
    head = int4.build("lm_head", ["h"], [torch.randn(48, 64)])
    assert isinstance(head, DispatchLinear) and isinstance(head.small, GroupInt8Linear)
    assert linear_weight_bytes(head, rows=1) == 48 * 64 + 4 * 48 * 2 * 4

    # int8 with the file's 4-bit blocks: 8-bit codes that hold the file's numbers exactly.
    int8 = LinearBuilder("int8", torch.float32, CPU, dict(blocks)).build("qkv", names, weights)
    assert isinstance(int8, DispatchLinear) and isinstance(int8.small, GroupInt8Linear)
    torch.testing.assert_close(int8(x), exact, atol=1e-4, rtol=1e-4)
    # A shape the int4 kernel does not take (N not a multiple of 16) runs int8 per channel.
    odd = LinearBuilder("int8", torch.float32, CPU, {}).build("o", ["c"], [torch.randn(8, 64)])
    assert isinstance(odd, DispatchLinear) and isinstance(odd.small, Int8Linear)

    with pytest.raises(HeddleError, match="unknown quantization"):
        LinearBuilder("int3", torch.float32, CPU)


def test_auto_adds_the_bias_on_both_paths():
    """A layer with a bias (e.g. Qwen2's qkv) gets it above max_rows too, on the float path."""
    torch.manual_seed(3)
    weight, bias = torch.randn(32, 64), torch.randn(32)
    blocks = {"q.weight": _file_blocks(weight)}
    layer = LinearBuilder("auto", torch.float32, CPU, blocks).build("qkv", ["q.weight"], [weight],
                                                                     bias=bias)
    assert isinstance(layer, DispatchLinear) and layer.large is not None
    x = torch.randn(6, 64)
    exact = x @ blocks["q.weight"].dequantize().T + bias
    layer.max_rows = 1 << 62  # every row count on the quantized kernel
    torch.testing.assert_close(layer(x), exact, atol=1e-4, rtol=1e-4)
    layer.max_rows = 2  # six rows: the float path
    torch.testing.assert_close(layer(x), x @ weight.T + bias, atol=1e-4, rtol=1e-4)
    layer.drop_small()  # the float path alone keeps the bias too
    torch.testing.assert_close(layer(x), x @ weight.T + bias, atol=1e-4, rtol=1e-4)


class _Timed:
    """A fake layer whose call advances a fake clock by cost(rows)."""

    def __init__(self, clock: list[float], cost, in_features: int = 8) -> None:
        self.clock, self.cost = clock, cost
        self.in_features, self.out_features = in_features, 4
        self.dtype = torch.float32
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock[0] += self.cost(x.shape[0])
        return torch.full((x.shape[0], 4), 1.0 if self.cost is quant_cost else 2.0)


def quant_cost(rows: int) -> float:
    return 10.0 + 5.0 * rows  # cheap at few rows, steep


def float_cost(rows: int) -> float:
    return 40.0 + 1.0 * rows


def test_tune_dispatch_keeps_the_quantized_kernel_up_to_the_crossover():
    now = [0.0]
    layers = [DispatchLinear(_Timed(now, quant_cost), _Timed(now, float_cost),  # type: ignore[arg-type]
                             None, "gate_up", max_rows=1 << 62) for _ in range(3)]
    never = DispatchLinear(_Timed(now, lambda rows: 100.0), _Timed(now, float_cost),  # type: ignore[arg-type]
                           None, "down", max_rows=1 << 62)
    choices = tune_dispatch([*layers, never], rounds=2, clock=lambda: now[0])
    # quant < float while 10 + 5r < 40 + r, i.e. r < 7.5: rows 1, 2, 4 win, 8 loses.
    by_kind = {c.kind: c for c in choices}
    assert by_kind["gate_up"].max_rows == 4
    assert set(by_kind["gate_up"].timings_us) == {1, 2, 4, 8}
    assert all(layer.max_rows == 4 for layer in layers)
    assert by_kind["down"].max_rows == 0 and never.small is None
    x4, x5 = torch.zeros(4, 8), torch.zeros(5, 8)
    assert layers[0](x4)[0, 0] == 1.0  # quantized
    assert layers[0](x5)[0, 0] == 2.0  # float
    assert never(x4)[0, 0] == 2.0
    assert describe(choices) == "gate_up: int8 at <= 4 rows; down: float"


def test_a_kind_of_few_layers_is_timed_over_as_many_calls():
    now = [0.0]
    quick, slow = _Timed(now, quant_cost), _Timed(now, float_cost)
    head = DispatchLinear(quick, slow, None, "lm_head", max_rows=1 << 62)  # type: ignore[arg-type]
    choice, = tune_dispatch([head], rounds=5, clock=lambda: now[0], min_calls=40)
    # rows 1, 2, 4 win and 8 loses: 4 row counts, each 1 warm-up + 40 rounds of one call.
    assert choice.max_rows == 4
    assert quick.calls == slow.calls == 4 * 41
