"""Record the shape and duration of every step a real executor runs, and save/load such logs.

`StepRecorder` wraps any executor (`execute(SchedulerOutput) -> ExecutorOutput`) and keeps
(StepShape, seconds) for each non-empty step, seconds as the executor measured them
(`ExecutorOutput.step_duration`), and the idle gap before it (wall seconds since the previous
step returned; None for the first), from which `--from-run` fits the idle warm-up. Saved as
JSON, a log is what `heddle profile --from-run` fits a cost model to, and what
`benchmarks/sim_fidelity.py` compares the cost model against: the steps the engine
really ran, not a grid's guess at them. Torch-free.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.errors import HeddleError
from heddle.sim.block_layout import BlockBreaks
from heddle.sim.cost_model import StepShape

FORMAT = "heddle-step-log/1"
StepSample = tuple[StepShape, float]


class StepRecorder:
    """An executor that forwards to `executor` and logs every non-empty step it runs."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.steps: list[StepSample] = []
        self.gaps: list[float | None] = []  # idle seconds before each of `steps`
        self._last_end: float | None = None
        self._breaks = BlockBreaks()  # the decode rows' block-table breaks, step by step

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        start = time.perf_counter()
        output = self.executor.execute(scheduler_output)
        shape = StepShape.from_scheduler_output(scheduler_output,
                                                self._breaks.step(scheduler_output))
        if not shape.is_empty:
            self.steps.append((shape, output.step_duration))
            self.gaps.append(None if self._last_end is None else start - self._last_end)
            self._last_end = time.perf_counter()
        return output

    def __getattr__(self, name: str) -> Any:
        # Everything else (block_size, num_blocks, model_shape, ...) is the wrapped executor's.
        return getattr(self.executor, name)


def shape_to_json(shape: StepShape) -> dict[str, Any]:
    """What a cost model reads of a step: its prefill chunks, and of its decodes only the
    count, the summed context and the breaks in their block tables (kept when there are)."""
    row = {
        "prefill": [list(chunk) for chunk in shape.prefill_chunks],
        "decode": shape.num_decode_tokens,
        "decode_context": shape.decode_context_tokens,
        "sampled": shape.num_sampled_rows,
    }
    if shape.decode_block_breaks:
        row["decode_breaks"] = shape.decode_block_breaks
    return row


def shape_from_json(data: dict[str, Any]) -> StepShape:
    num_decode, total = int(data.get("decode", 0)), int(data.get("decode_context", 0))
    if num_decode and total < num_decode:
        raise ValueError(f"{num_decode} decodes cannot read {total} K/V entries")
    # The summed context spread evenly over the decodes: the same count and sum.
    base, extra = divmod(total, num_decode) if num_decode else (0, 0)
    contexts = (base + 1,) * extra + (base,) * (num_decode - extra)
    return StepShape(
        tuple((int(n), int(c)) for n, c in data.get("prefill", ())),
        contexts,
        int(data["sampled"]) if "sampled" in data else None,
        decode_block_breaks=int(data.get("decode_breaks", 0)),
    )


def save_steps(
    path: str | Path,
    steps: Iterable[StepSample],
    metadata: dict[str, Any] | None = None,
    gaps: Sequence[float | None] | None = None,
) -> None:
    """Write a step log; `gaps` (one per step: idle seconds before it, None unknown) are kept
    as each row's "idle_before"."""
    rows = [{**shape_to_json(shape), "seconds": seconds} for shape, seconds in steps]
    if gaps is not None:
        if len(gaps) != len(rows):
            raise ValueError(f"{len(gaps)} gaps for {len(rows)} steps")
        for row, gap in zip(rows, gaps, strict=True):
            row["idle_before"] = gap
    data = {"format": FORMAT, "metadata": dict(metadata or {}), "steps": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data) + "\n")


def load_steps(path: str | Path) -> tuple[list[StepSample], dict[str, Any]]:
    """(steps, metadata) of a log written by `save_steps`; a clear error for anything else."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HeddleError(f"cannot read step log {path}: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise HeddleError(f"{path} is not a heddle step log (format {FORMAT!r})")
    try:
        steps = [(shape_from_json(row), float(row["seconds"])) for row in data["steps"]]
    except (KeyError, TypeError, ValueError) as e:
        raise HeddleError(f"{path}: malformed step row: {e}") from e
    return steps, dict(data.get("metadata") or {})


def load_step_gaps(path: str | Path) -> list[float | None]:
    """The idle gap before each step of a log (None where it was not recorded)."""
    data = json.loads(Path(path).read_text())
    try:
        return [None if row.get("idle_before") is None else float(row["idle_before"])
                for row in data["steps"]]  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HeddleError(f"{path}: malformed idle_before: {e}") from e
