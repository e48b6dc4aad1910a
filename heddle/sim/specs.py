"""Model and hardware specs for the roofline: frozen dataclasses loaded from JSON.

The shipped specs live in `heddle/sim/specs/` as `model.<id>.json` (a `ModelShape`, see
heddle/model_shape.py) and `hardware.<id>.json` (a `HardwareSpec`); a path to a JSON file of the
same shape works wherever an id does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from heddle.errors import HeddleError
from heddle.model_shape import ModelShape

SPECS_DIR = Path(__file__).parent / "specs"


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
    # bytes/s one device copies to and from the second KV tier (host memory: PCIe for a GPU,
    # a memory copy on a CPU); 0: unknown (a simulated second tier needs it)
    host_bandwidth: float = 0.0
    source: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("compute_efficiency", "memory_efficiency"):
            if not 0.0 < getattr(self, f) <= 1.0:
                raise HeddleError(f"hardware spec {self.name!r}: {f} must be in (0, 1]")
        if self.memory_bandwidth <= 0 or self.memory_bytes <= 0:
            raise HeddleError(f"hardware spec {self.name!r}: memory figures must be positive")
        if self.host_bandwidth < 0:
            raise HeddleError(f"hardware spec {self.name!r}: host_bandwidth must be >= 0")
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


def load_model_spec(id_or_path: str | Path) -> ModelShape:
    shape: ModelShape = _build(ModelShape, "model", _load_json("model", id_or_path))
    return shape


def load_hardware_spec(id_or_path: str | Path) -> HardwareSpec:
    spec: HardwareSpec = _build(HardwareSpec, "hardware", _load_json("hardware", id_or_path))
    return spec
