"""The executor contract. `ModelExecutor` runs a forward pass; `SimulatedExecutor` a cost model."""

from __future__ import annotations

from typing import Protocol

from heddle.core.outputs import ExecutorOutput, SchedulerOutput


class Executor(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        """Compute one step. Must sample one token for every ScheduledRequest with sample=True."""
        ...
