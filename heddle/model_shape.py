"""The shape of a model as the cost models and the KV cache sizing see it: sizes, dtype, bytes.

One torch-free description shared by both sides: the real executor builds it from the loaded
network (`heddle.model.spec.ModelSpec.shape`), the simulator loads it from a spec file
(`heddle.sim.specs.load_model_spec`), and the roofline, the KV-pool sizing and the profiler
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from heddle.errors import HeddleError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer with grouped-query attention and a gated MLP, by its sizes."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"  # of the weights and the KV cache
    tie_word_embeddings: bool = False
    default_tp: int = 1  # tensor-parallel degree the model is usually served with
    source: str = ""

    def __post_init__(self) -> None:
        for f in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "default_tp",
        ):
            if getattr(self, f) < 1:
                raise HeddleError(f"model {self.name!r}: {f} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise HeddleError(f"model {self.name!r}: num_heads must divide by num_kv_heads")
        if self.dtype not in DTYPE_BYTES:
            raise HeddleError(
                f"model {self.name!r}: unknown dtype {self.dtype!r}; "
                f"use one of {', '.join(DTYPE_BYTES)}"
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Weights of one decoder layer: qkv, o, gate+up, down, two norms."""
        qkv = self.hidden_size * (self.q_size + 2 * self.kv_size)
        o_proj = self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return qkv + o_proj + mlp + 2 * self.hidden_size

    def num_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * self.layer_params() + embeddings + lm_head + self.hidden_size

    def weight_bytes(self) -> int:
        return self.num_params() * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """K and V bytes one token occupies on one device, all layers (KV heads split over tp)."""
        kv_heads_per_device = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads_per_device * self.head_dim * self.dtype_bytes

    def kv_blocks_in(self, memory_bytes: float, block_size: int, tp: int = 1) -> int:
        """How many KV blocks of `block_size` tokens fit in `memory_bytes` of one device."""
        if block_size < 1:
            raise HeddleError("block_size must be positive")
        return int(memory_bytes // (block_size * self.kv_bytes_per_token(tp)))
