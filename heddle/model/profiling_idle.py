"""The idle warm-up's measurement: the same step back to back and after sleeps (issue 18).

`profile_idle` times a few shapes that typically follow an idle wait, each just after a
back-to-back run of itself and then after sleeping 1 ms .. 1 s; `fit_idle` turns the samples
into a `heddle.sim.warmup.IdleWarmup` and checks it on each shape left out of its fit.
Torch-free, like heddle.model.profiling (the caller passes `ModelExecutor.execute`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.errors import HeddleError
from heddle.model.profiling import ExecuteFn, build_scheduler_output
from heddle.sim.cost_model import StepShape
from heddle.sim.warmup import DEFAULT_GAPS_S, IdleWarmup, fit_warmup


def idle_shapes(max_num_batched_tokens: int, max_num_seqs: int) -> list[StepShape]:
    """Steps that typically follow an idle wait at light load: a request's first chunk (ending
    its prompt), a lone decode, and a small mixed step."""
    chunk = max(2, min(96, max_num_batched_tokens))
    shapes = [StepShape(((chunk, chunk),), (), num_sampled=1), StepShape((), (128,))]
    small = max(2, min(48, max_num_batched_tokens - 2))
    if max_num_seqs >= 3 and small + 2 <= max_num_batched_tokens:
        shapes.append(StepShape(((small, small),), (100, 200), num_sampled=3))
    return shapes


@dataclass(frozen=True, slots=True)
class IdleSample:
    """One timed step after an idle gap, beside the same shape just before it back to back."""

    shape_index: int
    sleep: float  # seconds slept
    gap: float  # seconds between the end of the back-to-back run and the start of this one
    back_to_back: float
    after_idle: float

    @property
    def extra(self) -> float:
        return self.after_idle - self.back_to_back


def profile_idle(
    execute_fn: ExecuteFn,
    shapes: Sequence[StepShape],
    block_size: int,
    gaps: Sequence[float] = DEFAULT_GAPS_S,
    repeats: int = 3,
    *,
    num_blocks: int | None = None,
    vocab_size: int = 1000,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> list[IdleSample]:
    """Time each shape back to back (two runs, the second timed), then after sleeping each of
    `gaps` seconds; `repeats` rounds, the order of the gaps rotated every round."""
    if repeats < 1 or not gaps or min(gaps) <= 0:
        raise HeddleError("idle profiling needs repeats >= 1 and positive gaps")
    step_id = 0
    finished: list[str] = []

    def run(shape: StepShape) -> tuple[float, float]:
        nonlocal step_id, finished
        so = build_scheduler_output(shape, step_id, block_size, num_blocks, vocab_size)
        so.finished_request_ids = finished
        start = clock()
        execute_fn(so)
        end = clock()
        finished, step_id = list(so.request_ids), step_id + 1
        return start, end

    samples: list[IdleSample] = []
    for round_ in range(repeats):
        order = list(gaps[round_ % len(gaps) :]) + list(gaps[: round_ % len(gaps)])
        for index, shape in enumerate(shapes):
            for gap in order:
                run(shape)
                start, end = run(shape)
                sleep(gap)
                idle_start, idle_end = run(shape)
                samples.append(IdleSample(index, gap, idle_start - end, end - start,
                                          idle_end - idle_start))  # fmt: skip
    return samples


def fit_idle(
    samples: Sequence[IdleSample], gaps: Sequence[float] = DEFAULT_GAPS_S
) -> tuple[IdleWarmup, dict[str, Any]]:
    """The warm-up fit to every sample, and its self-check: each shape's after-idle times
    predicted by a warm-up fit to the other shapes (leave one shape out), median |error|
    with the warm-up and without it (the back-to-back time alone)."""

    def points(chosen: Sequence[IdleSample]) -> list[tuple[float, float]]:
        return [(s.sleep, s.extra) for s in chosen]

    warmup = fit_warmup(points(samples), gaps)
    shapes = sorted({s.shape_index for s in samples})
    with_errors, without_errors = [], []
    per_shape: dict[str, list[float]] = {}
    for index in shapes:
        own = [s for s in samples if s.shape_index == index]
        others = [s for s in samples if s.shape_index != index] or own
        held = fit_warmup(points(others), gaps)
        for s in own:
            with_errors.append(abs(s.back_to_back + held.time(s.sleep) - s.after_idle)
                               / s.after_idle)  # fmt: skip
            without_errors.append(abs(s.back_to_back - s.after_idle) / s.after_idle)
        # Per shape: back-to-back median seconds, then the median ratio after each gap.
        base = statistics.median(s.back_to_back for s in own)
        per_shape[str(index)] = [base] + [
            statistics.median([s.after_idle / s.back_to_back for s in own if s.sleep == g] or [1.0])
            for g in gaps
        ]
    check = {
        "gaps": list(gaps),
        "per_shape_base_s_and_ratio": per_shape,
        "held_out_median_abs_with": statistics.median(with_errors),
        "held_out_median_abs_without": statistics.median(without_errors),
    }
    return warmup, check
