"""Small building blocks of the network: a linear layer with prepacked CPU weights, RMSNorm,
and rotary position embeddings (with linear and llama3 frequency scaling)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from heddle.model.device import cpu_has_native_bf16
from heddle.model.spec import ModelSpec, RopeScaling

# Row count the oneDNN weight layout is tuned for; any row count works.
_PACK_BATCH_HINT = 64


class Linear:
    """y = x @ W.T (+ b), W: [out_features, in_features].

    On CPU the weight is reordered once into oneDNN's blocked layout, in float32 and (on CPUs
    with native bf16: AVX512-BF16 / AMX) in bfloat16. On AVX2 machines that ran the small-M
    float32 matmuls of decoding 1.3-2x faster than MKL's sgemm behind F.linear; on a Xeon with
    AMX, bf16 matmuls of SmolLM2's shapes ran 1.3-3.5x faster than bf16 F.linear at 1-256 rows
    (results of benchmarks/linear_microbench.py in docs/BENCHMARKS.md). Elsewhere, or if the
    private op is missing, it is plain F.linear.
    """

    __slots__ = ("bias", "dtype", "in_features", "out_features", "packed", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 prepack: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.bias = bias
        self.packed: torch.Tensor | None = None
        self.weight: torch.Tensor | None = weight
        if prepack and _can_prepack(weight):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(
                    weight.contiguous(), _PACK_BATCH_HINT
                )
                self.weight = None  # the packed copy replaces it
            except (RuntimeError, AttributeError):
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        assert self.weight is not None
        return F.linear(x, self.weight, self.bias)


def _can_prepack(weight: torch.Tensor) -> bool:
    if weight.dtype == torch.bfloat16:
        dtype_ok = cpu_has_native_bf16()  # emulated bf16 in oneDNN is no gain
    else:
        dtype_ok = weight.dtype == torch.float32
    return (
        weight.device.type == "cpu"
        and dtype_ok
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm: normalize in float32, cast back, then scale (as transformers does).

    The float32 normalization is torch's fused rms_norm (no weight): 4 ops instead of the 8 of
    x * rsqrt(mean(x^2) + eps) spelled out, with the same result; a decode step runs two per
    layer, and at batch 1 a step's cost is mostly such small ops."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def rope_inv_freq(spec: ModelSpec, rope_freqs: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], float32, with the model's scaling applied."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope_freqs is not None:  # GGUF llama3 models store the per-frequency divisors
        return inv_freq / rope_freqs.float()
    scaling = spec.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, smooth between."""
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin tables; rotates the two halves of each head (HF convention)."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        positions = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = torch.outer(positions, inv_freq)  # [P, D/2], float32 as in transformers
        half = freqs.shape[1]
        self.half = half
        # [P, D]. The sign of rotate_half is folded into the sin table:
        # rotate_half(x) * sin == roll(x, D/2) * cat(-sin, sin).
        self.cos = torch.cat([freqs.cos(), freqs.cos()], dim=1).to(device=device, dtype=dtype)
        self.sin = torch.cat([-freqs.sin(), freqs.sin()], dim=1).to(device=device, dtype=dtype)
        self.max_positions = max_positions

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for the given positions: [T, 1, D] each (broadcast over heads)."""
        return (self.cos.index_select(0, positions).unsqueeze(1),
                self.sin.index_select(0, positions).unsqueeze(1))

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, D] -> rotated, same shape."""
        return x * cos + torch.roll(x, self.half, dims=-1) * sin
