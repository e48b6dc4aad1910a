"""The simulator: cost models and a SimulatedExecutor that drive the real engine on a virtual clock.

`build_sim_engine(config, model=..., hardware=...)` makes the simulated engine, `simulate(workload,
engine)` runs a workload through it. Nothing here imports torch.
"""

from __future__ import annotations

from heddle.model_shape import ModelShape
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import ProfiledCostModel, fit_profile
from heddle.sim.registry import ConstantCostModel, cost_model_names, make_cost_model
from heddle.sim.roofline import RooflineCostModel, kv_cache_blocks
from heddle.sim.simulator import (
    SimMachine,
    SimulationResult,
    build_sim_engine,
    sim_engine,
    sim_machine,
    simulate,
)
from heddle.sim.specs import (
    HardwareSpec,
    hardware_ids,
    load_hardware_spec,
    load_model_spec,
    model_ids,
)

__all__ = [
    "ConstantCostModel",
    "CostModel",
    "HardwareSpec",
    "ModelShape",
    "ProfiledCostModel",
    "RooflineCostModel",
    "SimMachine",
    "SimulatedExecutor",
    "SimulationResult",
    "StepShape",
    "build_sim_engine",
    "cost_model_names",
    "fit_profile",
    "hardware_ids",
    "kv_cache_blocks",
    "load_hardware_spec",
    "load_model_spec",
    "make_cost_model",
    "model_ids",
    "sim_engine",
    "sim_machine",
    "simulate",
]
