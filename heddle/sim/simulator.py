"""The simulator: the real Engine, Scheduler and policies on a virtual clock.

Only the executor (a cost model) and the clock are replaced; the event loop is the one real
replays use (heddle/engine/replay.py). When nothing can run, the virtual clock jumps to the next
arrival.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import EngineConfig
from heddle.engine.engine import Engine
from heddle.engine.replay import ReplayResult, replay
from heddle.workloads import Workload

SIM_EOS_TOKEN_ID = 2

# A simulation's result is a replay's result on a virtual clock.
SimulationResult = ReplayResult


def simulate(
    workload: Workload,
    config: EngineConfig,
    executor_factory: Callable[[VirtualClock], Any],
    *,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int | None = None,
    record_steps: bool = True,
    record_step_requests: bool = False,
    progress: bool = False,
) -> SimulationResult:
    """Run `workload` through a fresh Engine whose executor `executor_factory(clock)` builds."""
    clock = VirtualClock()
    engine = Engine(
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
    return replay(engine, workload, vocab_size=vocab_size, progress=progress)
