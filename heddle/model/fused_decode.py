"""The decoder stack for a decode-only step: per layer four matmuls and three C calls.

A decode step (every row one token, all attending through the C decode kernel) spends most of
its non-matmul time dispatching small ops: ~25 per layer between the four projections, ~30
layers, a few microseconds each (benchmarks/decode_microbench.py --compare-fused measures it).
Here each layer runs

    x = RMSNorm(hidden += delta)            heddle_add_rms_norm  (the residual add in place)
    qkv = qkv_proj(x)                       the layer's linear (int4 / int8 / bf16 as planned)
    attn = attention(RoPE(q, k), v)         heddle_decode_attention (K/V stored, paged kernel)
    x = RMSNorm(hidden += o_proj(attn))     heddle_add_rms_norm
    delta = down_proj(silu_mul(gate_up_proj(x)))   heddle_silu_mul between the two linears

with the same rounding as the eager path (csrc/decode_layer.c), so it is the same function:
tests/model/test_fused_decode.py checks it against the eager layers. Steps with a prefill
chunk, models with q/k norms (Qwen3) and caches the C kernel does not take run the eager
path (heddle.model.llama.DecoderLayer.forward).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from heddle.model.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from heddle.model.llama import LlamaForCausalLM

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_ptr, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class DecodeLayerKernels:
    """The three C calls of csrc/decode_layer.c for one dtype."""

    def __init__(self, library: ctypes.CDLL, dtype: torch.dtype) -> None:
        suffix = _SUFFIX[dtype]
        self.dtype = dtype
        self.add_rms_norm = getattr(library, f"heddle_add_rms_norm_{suffix}")
        self.add_rms_norm.restype = None
        self.add_rms_norm.argtypes = [_ptr] * 4 + [_i64] * 2 + [_f32, _i64]
        self.silu_mul = getattr(library, f"heddle_silu_mul_{suffix}")
        self.silu_mul.restype = None
        self.silu_mul.argtypes = [_ptr] * 2 + [_i64] * 3
        self.attention = getattr(library, f"heddle_decode_attention_{suffix}")
        self.attention.restype = ctypes.c_int
        self.attention.argtypes = [_ptr] * 11 + [_i64] * 9 + [_f32, _i64]

    @staticmethod
    def supports(dtype: torch.dtype) -> bool:
        return dtype in _SUFFIX


def fused_step_applies(model: LlamaForCausalLM, metadata: AttentionMetadata,
                       num_tokens: int) -> bool:
    """A decode-only step the fused layers can run."""
    return (model.fused is not None and model.fused_enabled and not metadata.prefills
            and metadata.decode_tables is not None
            and metadata.num_decode_tokens == num_tokens)


def run_fused_decode(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
    kv_caches: list[torch.Tensor],  # per layer [2, KVH, num_blocks, block_size, D]
    metadata: AttentionMetadata,
) -> torch.Tensor:
    """Hidden states after the last layer (before the final norm): [B, hidden]."""
    kernels = model.fused
    assert kernels is not None and metadata.decode_tables is not None
    spec = model.spec
    batch = input_ids.shape[0]
    dtype = model.dtype
    heads, kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    _, _, num_blocks, block_size, _ = kv_caches[0].shape
    tables = metadata.decode_tables.block_tables.contiguous()
    context_lens = metadata.decode_tables.context_lens.contiguous()
    positions = positions.contiguous()
    slots = metadata.slot_mapping.contiguous()
    threads = torch.get_num_threads()
    eps = spec.rms_norm_eps
    scale = model.layers[0].scale
    window = metadata.sliding_window or 0

    hidden = F.embedding(input_ids, model.embed_tokens)  # [B, hidden], updated in place
    x = torch.empty_like(hidden)  # each norm's output, the input of the next projection
    attn = torch.empty((batch, heads * head_dim), dtype=dtype)
    act = torch.empty((batch, spec.intermediate_size), dtype=dtype)
    q_scratch = torch.empty(batch * heads * head_dim, dtype=torch.float32)
    out_scratch = torch.empty_like(q_scratch)
    hidden_p, x_p, attn_p, act_p = (t.data_ptr() for t in (hidden, x, attn, act))
    fixed = (positions.data_ptr(), model.rope.cos.data_ptr(), model.rope.sin.data_ptr())
    step = (slots.data_ptr(), tables.data_ptr(), context_lens.data_ptr(),
            q_scratch.data_ptr(), out_scratch.data_ptr(), attn_p, batch, heads, kv_heads,
            head_dim, num_blocks, block_size, tables.shape[1], model.rope.max_positions, window,
            scale, threads)
    norm, silu_mul, attention = kernels.add_rms_norm, kernels.silu_mul, kernels.attention
    hidden_size, inter = spec.hidden_size, spec.intermediate_size
    delta: torch.Tensor | None = None
    for layer, kv_cache in zip(model.layers, kv_caches, strict=True):
        norm(hidden_p, None if delta is None else delta.data_ptr(), layer.input_norm.data_ptr(),
             x_p, batch, hidden_size, eps, threads)
        qkv = layer.qkv_proj(x)  # [B, (H + 2 KVH) * D]
        status = attention(qkv.data_ptr(), *fixed, kv_cache.data_ptr(), *step)
        if status != 0:
            raise ValueError(f"fused decode attention failed (status {status}): a slot or "
                             "position outside the cache, or an unsupported shape")
        o = layer.o_proj(attn)
        norm(hidden_p, o.data_ptr(), layer.post_attention_norm.data_ptr(), x_p, batch,
             hidden_size, eps, threads)
        gate_up = layer.gate_up_proj(x)  # [B, 2 * inter]
        silu_mul(gate_up.data_ptr(), act_p, batch, inter, threads)
        delta = layer.down_proj(act)
    assert delta is not None
    return hidden.add_(delta)
