"""Cost models by name, for configs and the command line.

make_cost_model("roofline", model="llama-3.1-8b", hardware="h100", tp=1)
make_cost_model("profiled", path="profiles/smollm2-cpu.json")
make_cost_model("constant", seconds=0.01)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from heddle.errors import HeddleError
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.roofline import RooflineCostModel


class ConstantCostModel(CostModel):
    """Every non-empty step takes `seconds`: for tests and for isolating scheduling effects."""

    def __init__(self, seconds: float = 0.01) -> None:
        if seconds < 0:
            raise HeddleError("a step cannot take negative time")
        self.seconds = seconds

    def step_time(self, shape: StepShape) -> float:
        return 0.0 if shape.is_empty else self.seconds

    def describe(self) -> str:
        return f"constant({self.seconds}s)"


def _roofline(
    model: str,
    hardware: str,
    tp: int | None = None,
    dtype: str | None = None,
    grammar_row_seconds: float | None = None,
) -> CostModel:
    extra = {} if grammar_row_seconds is None else {"grammar_row_seconds": grammar_row_seconds}
    return RooflineCostModel(model, hardware, tp=tp, dtype=dtype, **extra)


def _profiled(path: str) -> CostModel:
    return ProfiledCostModel.load(path)


COST_MODELS: Mapping[str, Callable[..., CostModel]] = MappingProxyType(
    {"roofline": _roofline, "profiled": _profiled, "constant": ConstantCostModel}
)


def cost_model_names() -> list[str]:
    return sorted(COST_MODELS)


def make_cost_model(name: str, **options: Any) -> CostModel:
    """Build the cost model registered under `name` with its keyword options."""
    factory = COST_MODELS.get(name.lower())
    if factory is None:
        raise HeddleError(f"unknown cost model {name!r}: known are {', '.join(cost_model_names())}")
    try:
        return factory(**options)
    except TypeError as e:
        raise HeddleError(f"bad options for cost model {name!r}: {e}") from e
