"""What a loaded network looks like: the hyperparameters the network is built from (`ModelSpec`).

Its sizes alone, as the cost models and the KV cache sizing see them, are a
`heddle.model_shape.ModelShape` (`ModelSpec.shape`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from heddle.errors import ModelLoadError
from heddle.model_shape import ModelShape

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling. `rope_type` is "linear" or "llama3" (Llama 3.1+)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ModelLoadError(f"unsupported rope scaling type {self.rope_type!r}")
        if self.factor <= 0:
            raise ModelLoadError("rope scaling factor must be positive")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Hyperparameters of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3)."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_window: int | None = None  # Mistral: attend to at most this many past tokens

    def __post_init__(self) -> None:
        if self.family not in SUPPORTED_FAMILIES:
            supported = ", ".join(SUPPORTED_FAMILIES)
            raise ModelLoadError(
                f"unsupported architecture {self.family!r}: heddle runs {supported}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"invalid model config: {name} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                "invalid model config: num_heads must be a multiple of num_kv_heads"
            )
        if self.head_dim % 2:
            raise ModelLoadError("invalid model config: head_dim must be even for RoPE")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def shape(self, name: str, dtype: str) -> ModelShape:
        """This network's sizes (KV bytes per token, weight bytes, ...) with weights and KV cache
        in `dtype` ("float32", "bfloat16", "float16")."""
        return ModelShape(
            name=name,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            dtype=dtype,
            tie_word_embeddings=self.tie_word_embeddings,
        )
