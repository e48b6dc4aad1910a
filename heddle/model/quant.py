"""Weight-only quantized linear layers (CPU): int4 and int8 in groups of 32, int8 per channel.

Two sources of quantized weights:
- a GGUF file's own blocks (`BlockQuantized`: Q4_0 / Q4_1 / Q8_0, 32 values per block along the
  input axis, w = scale * code + min). Q4_0 and Q4_1 map exactly onto torch's int4 kernel
  (w = (code - 8) * scale + zero with zero = min + 8 * scale), so a Q4 model runs its int4 path
  with the file's own numbers;
- quantization at load of float weights (int8: symmetric per group of 32, like Q8_0; int4:
  asymmetric min/max per group of 32, like Q4_1).

Kernels: torch.ops.aten._weight_int4pack_mm_for_cpu (`Int4Linear`; and `GroupInt8Linear`, 8-bit
codes in groups of 32 as two 4-bit planes on the same kernel, so Q8_0 and Q4_x blocks keep their
own numbers at 8 bits) and _weight_int8pack_mm (`Int8Linear`: one scale per output channel, the
fastest int8 kernel here, but it re-quantizes per-group blocks). They dequantize inside the
matmul; activations in bf16 or fp32 (only bf16 has fast paths on x86), and the scales must be
in the activations' dtype: in bf16 the file's fp16 scales are rounded to bf16 (8 bits of
mantissa), in float32 the kernels compute with the file's numbers exactly.
`ModelQuantizer` decides, per linear layer, what runs at which row count (see its doc).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTIZATION_MODES = ("auto", "none", "int8", "int4")
GROUP_SIZE = 32  # values per int4 group, and per GGUF block
_INT4_INNER_K_TILES = 2


@dataclass(slots=True)
class BlockQuantized:
    """A weight [N, K] in blocks of GROUP_SIZE along K: w[n, k] = scales[n, k // 32] * codes[n, k]
    + mins[n, k // 32]."""

    codes: torch.Tensor  # [N, K] uint8 in 0..15 (bits 4) or int8 (bits 8)
    scales: torch.Tensor  # [N, K // 32] float32
    mins: torch.Tensor  # [N, K // 32] float32 (zeros for symmetric formats)
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.codes.shape
        return n, k

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        codes = self.codes.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
        w = codes * self.scales.unsqueeze(-1) + self.mins.unsqueeze(-1)
        return w.view(n, k)

    def select_rows(self, index: torch.Tensor) -> BlockQuantized:
        return BlockQuantized(self.codes[index], self.scales[index], self.mins[index], self.bits)

    @staticmethod
    def cat(parts: list[BlockQuantized]) -> BlockQuantized:
        """Stack along the output axis (fused q/k/v and gate/up)."""
        return BlockQuantized(
            torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
            torch.cat([p.mins for p in parts]), parts[0].bits,
        )


def quantize_int4_blocks(weight: torch.Tensor) -> BlockQuantized:
    """Asymmetric 4-bit quantization of a float weight [N, K] in groups of 32 (min/max)."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp(min=1e-10)
    codes = torch.round((groups - low.unsqueeze(-1)) / scales.unsqueeze(-1)).clamp_(0, 15)
    return BlockQuantized(codes.to(torch.uint8).view(n, k), scales, low, 4)


def quantize_int8_blocks(weight: torch.Tensor) -> BlockQuantized:
    """Symmetric 8-bit quantization of a float weight [N, K] in groups of 32 (as Q8_0)."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
    scales = (groups.abs().amax(-1) / 127).clamp(min=1e-10)
    codes = torch.round(groups / scales.unsqueeze(-1)).clamp_(-127, 127)
    return BlockQuantized(codes.to(torch.int8).view(n, k), scales, torch.zeros_like(scales), 8)


def _int4_scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor,
                           dtype: torch.dtype) -> torch.Tensor:
    """[N, G] scales and zeros -> the int4 kernel's [G, N, 2] (scale, zero), in `dtype`."""
    return torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)


class Int4Linear:
    """y = x @ W.T with W in int4 groups of 32 (torch's CPU int4 kernel). x: [M, K]."""

    __slots__ = ("in_features", "out_features", "packed", "scales_and_zeros")

    def __init__(self, blocks: BlockQuantized, dtype: torch.dtype) -> None:
        if blocks.bits != 4:
            raise ValueError("Int4Linear needs 4-bit blocks")
        self.out_features, self.in_features = blocks.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.codes.to(torch.int32).contiguous(), _INT4_INNER_K_TILES
        )
        zeros = blocks.mins + 8 * blocks.scales  # (code - 8) * scale + zero == scale * code + min
        # [K // 32, N, 2]: (scale, zero) per group and output channel
        self.scales_and_zeros = _int4_scales_and_zeros(blocks.scales, zeros, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, GROUP_SIZE, self.scales_and_zeros
        )

    @property
    def weight_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + (
            self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()
        )


class GroupInt8Linear:
    """y = x @ W.T with W in 8-bit codes u (0..255) in groups of 32 along K: w = s * u + m.

    torch has no grouped int8 kernel on CPU, so u = 16 * hi + lo runs as two 4-bit planes on
    the int4 kernel: the weight [N, 2K] is [hi | lo] (scales 16 s and s) and the input [x | x],
    one call. Exact for the file's blocks: Q8_0 (signed codes c: u = c + 128, the -128 s in the
    hi plane's zero, 0) and Q4_x (u = q, hi = 0: the lo plane is Int4Linear's own numbers).
    Every zero is a power-of-two multiple of s or the one Int4Linear uses, so bf16 rounds
    nothing but s and m, as in Int4Linear. Reads 8 bits per weight plus 4 scales per group."""

    __slots__ = ("in_features", "out_features", "packed", "scales_and_zeros")

    def __init__(self, blocks: BlockQuantized, dtype: torch.dtype) -> None:
        self.out_features, self.in_features = blocks.shape
        codes = blocks.codes.to(torch.int32)
        signed = blocks.bits == 8
        unsigned = codes + 128 if signed else codes  # 0..255
        if int(unsigned.min()) < 0 or int(unsigned.max()) > 255:
            raise ValueError("GroupInt8Linear needs 8-bit or 4-bit codes")
        planes = torch.cat([unsigned >> 4, unsigned & 15], dim=1).contiguous()  # [N, 2K]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(planes,
                                                                         _INT4_INNER_K_TILES)
        s = blocks.scales
        # hi plane: (hi - 8) * 16 s + z_hi = 16 s hi - 128 s (signed) or 16 s hi (unsigned);
        # lo plane: (lo - 8) * s + z_lo = s lo + m.
        zero_hi = torch.zeros_like(s) if signed else 128 * s
        self.scales_and_zeros = _int4_scales_and_zeros(
            torch.cat([16 * s, s], dim=1), torch.cat([zero_hi, blocks.mins + 8 * s], dim=1),
            dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            torch.cat([x, x], dim=-1), self.packed, GROUP_SIZE, self.scales_and_zeros
        )

    @property
    def weight_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + (
            self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()
        )


class Int8Linear:
    """y = x @ W.T with W in int8, one scale per output channel. x: [M, K]."""

    __slots__ = ("in_features", "out_features", "qweight", "scales")

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        self.out_features, self.in_features = weight.shape
        weight = weight.float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-10)
        self.qweight = torch.round(weight / scales.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
        self.scales = scales.to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)

    @property
    def weight_bytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()


def int4_supported(in_features: int, out_features: int) -> bool:
    """Shapes torch's CPU int4 kernel takes (K in whole groups, N in tiles of 16)."""
    return in_features % GROUP_SIZE == 0 and out_features % 16 == 0 and hasattr(
        torch.ops.aten, "_weight_int4pack_mm_for_cpu"
    )


def int8_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")
