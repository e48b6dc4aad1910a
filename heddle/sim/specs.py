"""Model and hardware specs for the roofline: frozen dataclasses loaded from JSON.

The shipped specs live in `heddle/sim/specs/` as `model.<id>.json` and `hardware.<id>.json`;
a path to a JSON file of the same shape works wherever an id does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from heddle.errors import HeddleError

SPECS_DIR = Path(__file__).parent / "specs"

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer with grouped-query attention and a gated MLP."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
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
                raise HeddleError(f"model spec {self.name!r}: {f} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise HeddleError(f"model spec {self.name!r}: num_heads must divide by num_kv_heads")
        if self.dtype not in DTYPE_BYTES:
            raise HeddleError(
                f"model spec {self.name!r}: unknown dtype {self.dtype!r}; "
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
        """K and V bytes one token occupies on one GPU, all layers (KV heads split over tp)."""
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator (or CPU) as the roofline sees it: peaks, efficiencies, overhead."""

    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_bytes: float  # capacity of one device
    compute_efficiency: float = 1.0  # fraction of peak FLOP/s a large matmul reaches
    memory_efficiency: float = 1.0  # fraction of peak bandwidth a weight stream reaches
    step_overhead: float = 0.0  # seconds per step outside the kernels (launch, sampling, Python)
    interconnect_bandwidth: float = 0.0  # bytes/s one device sends in a ring all-reduce
    interconnect_latency: float = 0.0  # seconds per all-reduce
    source: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("compute_efficiency", "memory_efficiency"):
            if not 0.0 < getattr(self, f) <= 1.0:
                raise HeddleError(f"hardware spec {self.name!r}: {f} must be in (0, 1]")
        if self.memory_bandwidth <= 0 or self.memory_bytes <= 0:
            raise HeddleError(f"hardware spec {self.name!r}: memory figures must be positive")
        if self.step_overhead < 0 or self.interconnect_latency < 0:
            raise HeddleError(f"hardware spec {self.name!r}: times must be non-negative")
        if not self.peak_flops or any(v <= 0 for v in self.peak_flops.values()):
            raise HeddleError(f"hardware spec {self.name!r}: peak_flops must be positive")

    def flops_for(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise HeddleError(
                f"hardware spec {self.name!r} has no peak FLOP/s for {dtype}; "
                f"it knows {', '.join(sorted(self.peak_flops))}"
            )
        return self.peak_flops[dtype]


def _ids(kind: str) -> list[str]:
    prefix = f"{kind}."
    return sorted(p.name[len(prefix) : -len(".json")] for p in SPECS_DIR.glob(f"{prefix}*.json"))


def model_ids() -> list[str]:
    return _ids("model")


def hardware_ids() -> list[str]:
    return _ids("hardware")


def _load_json(kind: str, id_or_path: str | Path) -> dict[str, Any]:
    path = Path(id_or_path)
    if path.suffix != ".json":
        path = SPECS_DIR / f"{kind}.{str(id_or_path).lower()}.json"
    if not path.is_file():
        raise HeddleError(
            f"unknown {kind} spec {str(id_or_path)!r}: known ids are "
            f"{', '.join(_ids(kind))} (or give a path to a .json file)"
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _build(cls: type, kind: str, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HeddleError(f"{kind} spec {data.get('name')!r}: unknown fields {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise HeddleError(f"{kind} spec {data.get('name')!r}: {e}") from e


def load_model_spec(id_or_path: str | Path) -> ModelSpec:
    spec: ModelSpec = _build(ModelSpec, "model", _load_json("model", id_or_path))
    return spec


def load_hardware_spec(id_or_path: str | Path) -> HardwareSpec:
    spec: HardwareSpec = _build(HardwareSpec, "hardware", _load_json("hardware", id_or_path))
    return spec
