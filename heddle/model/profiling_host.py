"""The engine's own time around a step, and an idle engine's wake (issue 18).

The executor times its forward pass (`ExecutorOutput.step_duration`, what a cost model's step
price predicts), but a real engine's clock also runs while it schedules the next step, applies
the last one's tokens, processes outputs and goes round its event loop; and an engine that
sleeps until the next arrival wakes late (the sleep's overshoot) and adds the request before it
schedules it. On a virtual clock neither costs anything unless the cost model charges it.

`profile_host` measures both on this machine with the real `Engine` and `replay` loop:

- a burst of short requests all arriving at once, run on the real executor: the gap between
  the end of one step and the start of the next (`StepRecorder`'s gaps) as a function of the
  step's rows, fit as `host_constant + host_per_row * rows` (`fit_host`). On the real executor,
  because the engine's Python after a forward pass runs on caches the forward pass has filled
  with weights: on this dev box 3-5x slower than the same code between steps that cost nothing;
- requests spaced out so that each arrives at an idle engine, over an executor that costs
  nothing (a `SimulatedExecutor` on a clock of its own): the median of their first schedule
  minus their arrival is the sleep's overshoot plus what admitting a request costs
  (add_request: validation, block hashes, the policy's queue); the overshoot alone is timed
  apart (`time.sleep` of 10 ms, how late it returns: the `wake`, how fast the OS gives the
  sleeping thread a CPU back), the rest is `host_per_new_request`, which every arriving
  request costs, idle engine or not.

`heddle profile --from-run` fits the same line to a recorded run's back-to-back gaps instead.
Torch-free.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from heddle.clock import VirtualClock, WallClock
from heddle.errors import HeddleError
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.nnls import nnls
from heddle.sim.warmup import BACK_TO_BACK_S


class _Free(CostModel):
    def step_time(self, shape: StepShape) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class HostProfile:
    """Seconds: the engine's time around a step (constant + per row) and an idle engine's
    wake; how they were measured."""

    host_constant: float
    host_per_row: float
    host_per_new_request: float
    wake: float
    num_gaps: int = 0
    num_wakes: int = 0
    median_abs_error: float | None = None  # of the line, on the gaps it was fit to
    by_rows: dict[str, list[float]] = field(default_factory=dict)  # rows -> [gaps, median s]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        err = "" if self.median_abs_error is None else (
            f", median |error| {1e6 * self.median_abs_error:.0f} us")
        return [f"engine time around a step: {1e3 * self.host_constant:.3f} ms + "
                f"{1e3 * self.host_per_row:.4f} ms per row ({self.num_gaps} back-to-back gaps"
                f"{err}) + {1e3 * self.host_per_new_request:.3f} ms per new request; an idle "
                f"engine's wake: {1e3 * self.wake:.3f} ms "
                f"(median of {self.num_wakes})"]  # fmt: skip


def fit_host(points: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """(constant, per row, median |error|) of gap ~ constant + per_row * rows over
    (rows, gap seconds) of back-to-back steps: a non-negative line through the median gap of
    each row count, each weighted by how many gaps it has (an outlier gap, a page fault or a
    GC pause, moves a median little)."""
    groups: dict[int, list[float]] = {}
    for rows, gap in points:
        if rows < 1 or not math.isfinite(gap) or gap < 0:
            raise HeddleError(f"bad host-time point (rows {rows}, gap {gap})")
        groups.setdefault(rows, []).append(gap)
    if not groups:
        raise HeddleError("no back-to-back steps to fit the engine's time to")
    counts = sorted(groups)
    row_counts = np.array(counts, dtype=float)
    medians = np.array([statistics.median(groups[r]) for r in counts])
    weights = np.sqrt([len(groups[r]) for r in counts])
    x = np.stack([np.ones_like(row_counts), row_counts], axis=1) * weights[:, None]
    if len(counts) == 1:
        constant, per_row = float(medians[0]), 0.0
    else:
        scale = np.linalg.norm(x, axis=0)
        constant, per_row = (nnls(x / scale, medians * weights) / scale).tolist()
    errors = [abs(constant + per_row * r - g) for r, g in points]
    return constant, per_row, statistics.median(errors)


# A gap before a step that admits a request, under this, is the engine's work, not an idle wait.
ADMIT_GAP_S = 0.005


def host_from_run(
    steps: Sequence[tuple[StepShape, float]], gaps: Sequence[float | None]
) -> tuple[float, float, float, int, float]:
    """(constant, per row, median |error|, gaps used, per new request) fit to a recorded
    run's gaps: the line to the back-to-back gaps of steps that admit no request (a gap
    before a step that started at once after the previous one), and the median excess over
    that line of the gaps (under ADMIT_GAP_S) before a step with one new prompt (0 if none)."""
    from heddle.sim.profiled import new_prompts

    points = [(shape.num_requests, gap) for (shape, _), gap in zip(steps, gaps, strict=True)
              if gap is not None and gap <= BACK_TO_BACK_S
              and not new_prompts(shape)]  # fmt: skip
    constant, per_row, error = fit_host(points)
    admits = [gap - constant - per_row * shape.num_requests
              for (shape, _), gap in zip(steps, gaps, strict=True)
              if gap is not None and gap < ADMIT_GAP_S and new_prompts(shape) == 1]  # fmt: skip
    per_new = max(0.0, statistics.median(admits)) if admits else 0.0
    return constant, per_row, error, len(points), per_new


def sleep_overshoot(num_sleeps: int = 16, seconds: float = 0.01) -> float:
    """Median seconds `time.sleep(seconds)` returns late."""
    import time

    late = []
    for _ in range(num_sleeps):
        start = time.perf_counter()
        time.sleep(seconds)
        late.append(time.perf_counter() - start - seconds)
    return max(0.0, statistics.median(late))


def profile_host(
    config: Any,
    *,
    num_blocks: int,
    vocab_size: int,
    max_model_len: int,
    eos_token_id: int | None = None,
    executor: Any = None,
    num_requests: int = 32,
    length_scale: float = 0.1,
    num_wakes: int = 16,
    wake_rate: float = 20.0,
    seed: int = 0,
) -> HostProfile:
    """Time the engine's own work on `config` (its token budget and seats): a burst of
    `num_requests` chat requests (lengths x `length_scale`) at once on `executor` (None: one
    that costs nothing), rows from the seat cap down to 1; then `num_wakes` arriving at
    `wake_rate` per second, each at an idle engine that costs nothing."""
    from heddle.engine.engine import Engine
    from heddle.engine.replay import replay
    from heddle.model.step_log import StepRecorder
    from heddle.workloads import get_workload

    if num_requests < 1 or num_wakes < 1 or not wake_rate > 0:
        raise HeddleError("profile_host needs num_requests, num_wakes >= 1 and wake_rate > 0")

    def run(workload: Any, real: Any = None) -> tuple[StepRecorder, list[Any]]:
        free = SimulatedExecutor(_Free(), VirtualClock(), vocab_size, seed)
        recorder = StepRecorder(free if real is None else real)
        engine = Engine(config, recorder, num_blocks=num_blocks, clock=WallClock(),
                        eos_token_id=eos_token_id, max_model_len=max_model_len,
                        vocab_size=vocab_size)  # fmt: skip
        return recorder, replay(engine, workload, vocab_size=vocab_size).records

    from heddle.sim.executor import SimulatedExecutor

    options = {"length_scale": length_scale}
    burst, _ = run(get_workload("chat", seed=seed, num_requests=num_requests, rate=math.inf,
                                **options), executor)  # fmt: skip
    constant, per_row, error, used, _ = host_from_run(burst.steps, burst.gaps)
    _, records = run(get_workload("chat", seed=seed + 1, num_requests=num_wakes,
                                  rate=wake_rate, **options))  # fmt: skip
    waits = [r.first_scheduled_time - r.arrival_time for r in records
             if r.first_scheduled_time is not None]  # fmt: skip
    if not waits:
        raise HeddleError("no request was scheduled while measuring the wake")
    overshoot = sleep_overshoot()
    by_rows: dict[int, list[float]] = {}
    for (shape, _), gap in zip(burst.steps, burst.gaps, strict=True):
        if gap is not None and gap <= BACK_TO_BACK_S:
            by_rows.setdefault(shape.num_requests, []).append(gap)
    return HostProfile(
        constant, per_row, max(0.0, statistics.median(waits) - overshoot), overshoot, used,
        len(waits), error,
        {str(r): [float(len(g)), statistics.median(g)] for r, g in sorted(by_rows.items())},
    )
