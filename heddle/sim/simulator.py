"""The simulator: the real Engine, Scheduler and policies on a virtual clock.

Only the executor (a cost model) and the clock are replaced; the event loop is the one real
replays use (heddle/engine/replay.py). When nothing can run, the virtual clock jumps to the next
arrival.

    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    result = simulate(workload, engine)

`build_sim_engine` is the one recipe for a simulated engine (cost model, KV pool, executor):
`heddle simulate` and every benchmark use it. `sim_machine` is its first half (what N replicas
share: heddle/router/), `sim_engine` puts any executor on a virtual clock (tests use hand-made
ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import EngineConfig
from heddle.engine.engine import Engine
from heddle.engine.replay import ReplayResult, replay
from heddle.errors import HeddleError
from heddle.model_shape import ModelShape
from heddle.sim.cost_model import CostModel
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import ProfiledCostModel
from heddle.sim.roofline import RooflineCostModel, kv_cache_blocks
from heddle.sim.specs import HardwareSpec, load_hardware_spec, load_model_spec
from heddle.spec.sim import sim_acceptance
from heddle.workloads import Workload

SIM_EOS_TOKEN_ID = 2

# A simulation's result is a replay's result on a virtual clock.
SimulationResult = ReplayResult


def sim_engine(
    config: EngineConfig,
    executor_factory: Callable[[VirtualClock], Any],
    *,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int | None = None,
    record_steps: bool = True,
    record_step_requests: bool = False,
) -> Engine:
    """A fresh Engine on a new VirtualClock, its executor built by `executor_factory(clock)`."""
    clock = VirtualClock()
    return Engine(
        config,
        executor_factory(clock),
        num_blocks=num_blocks,
        clock=clock,
        eos_token_id=SIM_EOS_TOKEN_ID,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        record_steps=record_steps,
        record_step_requests=record_step_requests,
        final_outputs_only=True,
        compact_records=True,
    )


@dataclass(frozen=True, slots=True)
class SimMachine:
    """What a simulated engine runs on: the model's shape, a cost model and the KV pool."""

    shape: ModelShape
    cost_model: CostModel
    num_blocks: int

    def engine(
        self,
        config: EngineConfig,
        *,
        seed: int | None = None,
        max_model_len: int | None = None,
        record_steps: bool = True,
        record_step_requests: bool = False,
    ) -> Engine:
        """A fresh Engine on its own VirtualClock over a SimulatedExecutor of this machine; the
        executor's sampled token ids are seeded by `seed` (default `config.seed`)."""
        cost, vocab = self.cost_model, self.shape.vocab_size
        executor_seed = config.seed if seed is None else seed
        acceptance = sim_acceptance(config.scheduler.speculation, executor_seed)
        per_block = self.tier_seconds_per_block(config.cache.block_size)
        if config.cache.offload_blocks and per_block is None:
            raise HeddleError(
                f"offload_blocks={config.cache.offload_blocks} needs the second tier's "
                f"bandwidth: the cost model {cost.describe()} has no hardware spec with "
                "host_bandwidth"
            )
        if not config.cache.offload_blocks:
            per_block = None
        return sim_engine(
            config,
            lambda clock: SimulatedExecutor(
                cost, clock, vocab_size=vocab, seed=executor_seed, acceptance=acceptance,
                tier_seconds_per_block=per_block,
            ),
            num_blocks=self.num_blocks,
            vocab_size=vocab,
            max_model_len=max_model_len,
            record_steps=record_steps,
            record_step_requests=record_step_requests,
        )


    def tier_seconds_per_block(self, block_size: int) -> float | None:
        """Seconds to copy one KV block of this machine to or from the second tier: its
        bytes on one device over the hardware spec's host bandwidth (None: not known)."""
        hardware = getattr(self.cost_model, "hardware", None)
        bandwidth = getattr(hardware, "host_bandwidth", 0.0)
        if not bandwidth:
            return None
        tp = getattr(self.cost_model, "tp", 1)
        return self.shape.kv_bytes_per_token(tp) * block_size / bandwidth


def sim_machine(
    config: EngineConfig,
    *,
    model: str | Path | ModelShape = "llama-3.1-8b",
    hardware: str | Path | HardwareSpec = "h100",
    tp: int | None = None,
    dtype: str | None = None,
    cost_model: CostModel | str | Path | None = None,
    num_blocks: int | None = None,
) -> SimMachine:
    """The model, cost model and KV pool `config` is simulated on.

    model / hardware: spec ids or JSON paths (heddle/sim/specs/), or a `ModelShape` (e.g. a real
    executor's `model_shape`) / `HardwareSpec`. tp: tensor-parallel degree (default: the model's).
    dtype: of weights and KV cache (default: the model spec's).
    cost_model: None for the roofline of `model` on `hardware`; a `CostModel`; or the path of a
    profile JSON from `heddle profile`.
    num_blocks: the KV pool; default `config.cache.num_blocks`, else (roofline only) what fits in
    the hardware's memory after the weights and a step's activations.
    """
    shape = model if isinstance(model, ModelShape) else load_model_spec(model)
    if dtype is not None:
        shape = replace(shape, dtype=dtype)
    tp = shape.default_tp if tp is None else tp
    cost: CostModel
    if cost_model is None:
        hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware_spec(hardware)
        cost = RooflineCostModel(shape, hw, tp=tp)
    elif isinstance(cost_model, CostModel):
        cost = cost_model
    else:
        path = Path(cost_model)
        if not path.is_file():
            raise HeddleError(f"no cost model file at {path}")
        cost = ProfiledCostModel.load(path)
    num_blocks = num_blocks or config.cache.num_blocks
    if num_blocks is None:
        if not isinstance(cost, RooflineCostModel):
            raise HeddleError(
                f"with the cost model {cost.describe()}, give num_blocks (--num-blocks): the KV "
                "pool of the engine it was measured on"
            )
        num_blocks = kv_cache_blocks(
            shape,
            cost.hardware,
            config.cache.block_size,
            tp=tp,
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
            max_num_seqs=config.scheduler.max_num_seqs,
        )
    return SimMachine(shape, cost, num_blocks)


def build_sim_engine(
    config: EngineConfig,
    *,
    model: str | Path | ModelShape = "llama-3.1-8b",
    hardware: str | Path | HardwareSpec = "h100",
    tp: int | None = None,
    dtype: str | None = None,
    cost_model: CostModel | str | Path | None = None,
    num_blocks: int | None = None,
    seed: int | None = None,
    max_model_len: int | None = None,
    record_steps: bool = True,
    record_step_requests: bool = False,
) -> Engine:
    """The simulated engine: `config`'s scheduler and KV cache over a SimulatedExecutor on
    `sim_machine(config, model=..., ...)` (see there for the machine's arguments); `seed` seeds
    the executor's sampled token ids (default `config.seed`)."""
    machine = sim_machine(
        config,
        model=model,
        hardware=hardware,
        tp=tp,
        dtype=dtype,
        cost_model=cost_model,
        num_blocks=num_blocks,
    )
    return machine.engine(
        config,
        seed=seed,
        max_model_len=max_model_len,
        record_steps=record_steps,
        record_step_requests=record_step_requests,
    )


def simulate(workload: Workload, engine: Engine, *, progress: bool = False) -> SimulationResult:
    """Run every request of `workload` through `engine` (from `build_sim_engine` or
    `sim_engine`) at its arrival time on the engine's virtual clock."""
    if engine.vocab_size is None:
        raise HeddleError("a simulated engine needs a vocab_size for the workload's token ids")
    return replay(engine, workload, vocab_size=engine.vocab_size, progress=progress)
