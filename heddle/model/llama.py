"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a flat batch of tokens.

One forward call takes the new tokens of every scheduled request concatenated: [num_tokens].
Projections and MLPs run on [num_tokens, hidden] with no padding; only attention knows which
request a token belongs to (see `heddle.model.attention`). Weights are fused at load time:
q/k/v into one matmul, gate/up into another.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from heddle.errors import ModelLoadError
from heddle.model.attention import AttentionBackend, GatherBuffer, paged_attention
from heddle.model.attention_metadata import AttentionMetadata
from heddle.model.fused_decode import DecodeLayerKernels, fused_step_applies, run_fused_decode
from heddle.model.kernels import load_decode_kernel, load_library
from heddle.model.layers import RotaryEmbedding, rms_norm, rope_inv_freq
from heddle.model.linear_plan import LinearBuilder, LinearLayer, linear_weight_bytes
from heddle.model.quant import BlockQuantized
from heddle.model.spec import ModelSpec
from heddle.model.tuning_cache import plan_dispatch

# attend(q [T, H, D], k [T, KVH, D], v [T, KVH, D], kv_cache, scale) -> [T, H * D]: stores the
# new K/V in the layer's paged cache and attends.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

class DecoderLayer:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], prefix: str,
                 linears: LinearBuilder) -> None:
        dtype, device = linears.dtype, linears.device

        def raw(name: str) -> torch.Tensor:
            key = prefix + name
            if key not in weights:
                raise ModelLoadError(f"weight {key} is missing")
            return weights.pop(key)

        def take(name: str) -> torch.Tensor:
            return raw(name).to(device=device, dtype=dtype)

        def maybe(name: str) -> torch.Tensor | None:
            return take(name) if prefix + name in weights else None

        def linear(kind: str, names: list[str], bias: torch.Tensor | None = None) -> LinearLayer:
            return linears.build(kind, [prefix + n for n in names], [raw(n) for n in names],
                                 bias)

        self.spec = spec
        self.input_norm = take("input_layernorm.weight")
        self.post_attention_norm = take("post_attention_layernorm.weight")
        qkv_bias = None
        if spec.attention_bias:
            q_bias, k_bias, v_bias = (maybe(f"self_attn.{p}_proj.bias") for p in "qkv")
            if q_bias is not None and k_bias is not None and v_bias is not None:
                qkv_bias = torch.cat([q_bias, k_bias, v_bias])
        self.qkv_proj = linear("qkv", [f"self_attn.{p}_proj.weight" for p in "qkv"], qkv_bias)
        self.o_proj = linear("o", ["self_attn.o_proj.weight"], maybe("self_attn.o_proj.bias"))
        self.q_norm = take("self_attn.q_norm.weight") if spec.qk_norm else None
        self.k_norm = take("self_attn.k_norm.weight") if spec.qk_norm else None
        self.gate_up_proj = linear("gate_up", ["mlp.gate_proj.weight", "mlp.up_proj.weight"])
        self.down_proj = linear("down", ["mlp.down_proj.weight"])
        self.scale = 1.0 / math.sqrt(spec.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D]
        rope: RotaryEmbedding,
        kv_cache: torch.Tensor,  # [2, KVH, num_blocks, block_size, D]
        attend: Attend,
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
        attn = attend(q, k, v, kv_cache, self.scale)  # [T, H * D]
        hidden = hidden + self.o_proj(attn)
        x = rms_norm(hidden, self.post_attention_norm, spec.rms_norm_eps)
        gate, up = self.gate_up_proj(x).chunk(2, dim=1)
        return hidden + self.down_proj(F.silu(gate) * up)


class LlamaForCausalLM:
    """The network. Consumes `weights` (Hugging Face names); holds no KV cache of its own."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], *,
                 dtype: torch.dtype, device: torch.device, max_positions: int,
                 use_decode_kernel: bool = True, quantization: str = "none",
                 blocks: dict[str, BlockQuantized] | None = None,
                 float_kinds: frozenset[str] = frozenset()) -> None:
        """`quantization`, `blocks` (a GGUF's own quantized matrices) and `float_kinds`: see
        heddle.model.linear_plan."""
        self.spec = spec
        self.dtype = dtype
        self.device = device
        self.linears = LinearBuilder(quantization, dtype, device, dict(blocks or {}),
                                     float_kinds=float_kinds)
        weights = dict(weights)  # layers pop what they use
        embed = weights.pop("model.embed_tokens.weight", None)
        if embed is None:
            raise ModelLoadError("weight model.embed_tokens.weight is missing")
        self.embed_tokens = embed.to(device=device, dtype=dtype)
        self.layers = [
            DecoderLayer(spec, weights, f"model.layers.{i}.", self.linears)
            for i in range(spec.num_layers)
        ]
        norm = weights.pop("model.norm.weight", None)
        if norm is None:
            raise ModelLoadError("weight model.norm.weight is missing")
        self.norm = norm.to(device=device, dtype=dtype)
        lm_head = weights.pop("lm_head.weight", None)
        lm_head_name = "lm_head.weight"
        if spec.tie_word_embeddings or lm_head is None:
            lm_head, lm_head_name = embed, "model.embed_tokens.weight"
        self.lm_head = self.linears.build("lm_head", [lm_head_name], [lm_head])
        inv_freq = rope_inv_freq(spec, weights.pop("rope_freqs", None))
        self.rope = RotaryEmbedding(inv_freq, max_positions, dtype, device)
        # Reused by every layer and step. The C decode kernel runs on float32 / bf16 CPU caches.
        decode_kernel = None
        if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and use_decode_kernel:
            decode_kernel = load_decode_kernel()
        self.attention = AttentionBackend(GatherBuffer(dtype, device), decode_kernel)
        # Decode-only steps run each layer's small ops as three C calls (heddle.model.
        # fused_decode); `fused_enabled = False` runs them eagerly (for comparisons).
        self.fused: DecodeLayerKernels | None = None
        library = load_library() if decode_kernel is not None else None
        if library is not None and not spec.qk_norm and DecodeLayerKernels.supports(dtype):
            self.fused = DecodeLayerKernels(library, dtype)
        self.fused_enabled = True
        unused = sorted(k for k in weights if k.startswith("model.layers.") and "rotary" not in k)
        if unused:  # e.g. MLP biases: refuse rather than silently compute something else
            raise ModelLoadError(f"unsupported weights in checkpoint: {', '.join(unused[:3])}")

    def tune_linears(self, retune: bool = False) -> str:
        """Choose the kernel per row count of layers that have two (quantization auto): this
        machine's cached plan, or timed now and cached (heddle.model.tuning_cache; `retune`
        times again). Returns a one-line description of what runs, for the log."""
        mode = self.linears.mode
        if mode == "none":
            return "none"
        if mode != "auto":
            return mode
        return f"auto ({plan_dispatch(self.linears.built, self.dtype, retune)})"

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights a batch-1 decode step reads (embedding row reads excluded)."""
        total = 0
        for layer in [*self.layers, None]:
            linears = ([self.lm_head] if layer is None else
                       [layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj])
            total += sum(linear_weight_bytes(linear, rows=1) for linear in linears)
        return total

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor],  # per layer [2, KVH, num_blocks, block_size, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the last layer (before the final norm): [T, hidden]."""
        if fused_step_applies(self, metadata, input_ids.shape[0]):
            return run_fused_decode(self, input_ids, positions, kv_caches, metadata)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   scale: float) -> torch.Tensor:
            return paged_attention(q, k, v, kv_cache, metadata, scale, self.attention)

        return self.run_layers(input_ids, positions, kv_caches, attend)

    def run_layers(self, input_ids: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[torch.Tensor], attend: Attend) -> torch.Tensor:
        """The decoder stack, eagerly, with a given attention: [T] ids and positions ->
        [T, hidden]."""
        hidden = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rope.tables(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer.forward(hidden, cos, sin, self.rope, kv_cache, attend)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] rows to sample from -> float32 logits [S, vocab]."""
        logits = self.lm_head(rms_norm(hidden, self.norm, self.spec.rms_norm_eps))
        return logits.float()
