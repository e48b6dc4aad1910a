"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a flat batch of tokens.

One forward call takes the new tokens of every scheduled request concatenated: [num_tokens].
Projections and MLPs run on [num_tokens, hidden] with no padding; only attention knows which
request a token belongs to (see `heddle.model.attention`). Weights are fused at load time:
q/k/v into one matmul, gate/up into another.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from heddle.errors import ModelLoadError
from heddle.model.attention import AttentionBackend, GatherBuffer, paged_attention
from heddle.model.attention_metadata import AttentionMetadata
from heddle.model.kernels import load_decode_kernel
from heddle.model.layers import Linear, RotaryEmbedding, rms_norm, rope_inv_freq
from heddle.model.spec import ModelSpec


class DecoderLayer:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], prefix: str,
                 dtype: torch.dtype, device: torch.device) -> None:
        def take(name: str) -> torch.Tensor:
            key = prefix + name
            if key not in weights:
                raise ModelLoadError(f"weight {key} is missing")
            return weights.pop(key).to(device=device, dtype=dtype)

        def maybe(name: str) -> torch.Tensor | None:
            return take(name) if prefix + name in weights else None

        self.spec = spec
        self.input_norm = take("input_layernorm.weight")
        self.post_attention_norm = take("post_attention_layernorm.weight")
        qkv_weight = torch.cat([take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"),
                                take("self_attn.v_proj.weight")])
        qkv_bias = None
        if spec.attention_bias:
            q_bias, k_bias, v_bias = (maybe(f"self_attn.{p}_proj.bias") for p in "qkv")
            if q_bias is not None and k_bias is not None and v_bias is not None:
                qkv_bias = torch.cat([q_bias, k_bias, v_bias])
        self.qkv_proj = Linear(qkv_weight, qkv_bias)
        self.o_proj = Linear(take("self_attn.o_proj.weight"), maybe("self_attn.o_proj.bias"))
        self.q_norm = take("self_attn.q_norm.weight") if spec.qk_norm else None
        self.k_norm = take("self_attn.k_norm.weight") if spec.qk_norm else None
        self.gate_up_proj = Linear(torch.cat([take("mlp.gate_proj.weight"),
                                              take("mlp.up_proj.weight")]))
        self.down_proj = Linear(take("mlp.down_proj.weight"))
        self.scale = 1.0 / math.sqrt(spec.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D]
        rope: RotaryEmbedding,
        kv_cache: torch.Tensor,  # [2, KVH, num_blocks, block_size, D]
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        spec = self.spec
        num_tokens = hidden.shape[0]
        x = rms_norm(hidden, self.input_norm, spec.rms_norm_eps)
        qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) * D]
        qk, v = qkv.split([spec.q_size + spec.kv_size, spec.kv_size], dim=1)
        qk = qk.view(num_tokens, spec.num_heads + spec.num_kv_heads, spec.head_dim)
        v = v.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([spec.num_heads, spec.num_kv_heads], dim=1)
            qk = torch.cat([rms_norm(q, self.q_norm, spec.rms_norm_eps),
                            rms_norm(k, self.k_norm, spec.rms_norm_eps)], dim=1)
        qk = rope.apply(qk, cos, sin)  # q and k heads rotated together
        q, k = qk.split([spec.num_heads, spec.num_kv_heads], dim=1)
        attn = paged_attention(q, k, v, kv_cache, metadata, self.scale, backend)
        hidden = hidden + self.o_proj(attn)
        x = rms_norm(hidden, self.post_attention_norm, spec.rms_norm_eps)
        gate, up = self.gate_up_proj(x).chunk(2, dim=1)
        return hidden + self.down_proj(F.silu(gate) * up)


class LlamaForCausalLM:
    """The network. Consumes `weights` (Hugging Face names); holds no KV cache of its own."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], *,
                 dtype: torch.dtype, device: torch.device, max_positions: int,
                 use_decode_kernel: bool = True) -> None:
        self.spec = spec
        self.dtype = dtype
        self.device = device
        weights = dict(weights)  # layers pop what they use
        embed = weights.pop("model.embed_tokens.weight", None)
        if embed is None:
            raise ModelLoadError("weight model.embed_tokens.weight is missing")
        self.embed_tokens = embed.to(device=device, dtype=dtype)
        self.layers = [
            DecoderLayer(spec, weights, f"model.layers.{i}.", dtype, device)
            for i in range(spec.num_layers)
        ]
        norm = weights.pop("model.norm.weight", None)
        if norm is None:
            raise ModelLoadError("weight model.norm.weight is missing")
        self.norm = norm.to(device=device, dtype=dtype)
        lm_head = weights.pop("lm_head.weight", None)
        if spec.tie_word_embeddings or lm_head is None:
            lm_head = self.embed_tokens
        self.lm_head = Linear(lm_head.to(device=device, dtype=dtype))
        inv_freq = rope_inv_freq(spec, weights.pop("rope_freqs", None))
        self.rope = RotaryEmbedding(inv_freq, max_positions, dtype, device)
        # Reused by every layer and step. The C decode kernel runs on float32 CPU caches.
        decode_kernel = None
        if device.type == "cpu" and dtype == torch.float32 and use_decode_kernel:
            decode_kernel = load_decode_kernel()
        self.attention = AttentionBackend(GatherBuffer(dtype, device), decode_kernel)
        unused = sorted(k for k in weights if k.startswith("model.layers.") and "rotary" not in k)
        if unused:  # e.g. MLP biases: refuse rather than silently compute something else
            raise ModelLoadError(f"unsupported weights in checkpoint: {', '.join(unused[:3])}")

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor],  # per layer [2, KVH, num_blocks, block_size, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the last layer (before the final norm): [T, hidden]."""
        hidden = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rope.tables(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer.forward(hidden, cos, sin, self.rope, kv_cache, metadata,
                                   self.attention)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] rows to sample from -> float32 logits [S, vocab]."""
        logits = self.lm_head(rms_norm(hidden, self.norm, self.spec.rms_norm_eps))
        return logits.float()
