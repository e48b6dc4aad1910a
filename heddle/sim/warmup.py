"""The idle warm-up: extra time a step takes when nothing ran for a while before it.

A cost model prices a step by its shape, measured back to back. A real step that follows an
idle wait can take longer than the same shape back to back: the torch/OpenMP worker threads
have gone from spinning to sleeping, the CPU's caches and TLBs hold someone else's data, an
idle core clocks down. At light load most first steps of a request follow such a wait, so
the TTFT it adds is what a shape-only model misses (issue 18).

`IdleWarmup` is that extra time as a function of the idle gap (seconds since the previous
step ended): measured at a few gaps (`heddle profile` times shapes after sleeps of 1 ms to
1 s; `--from-run` reads the gaps a real run recorded), zero for back-to-back steps, linear
in log(gap) between the measured gaps and flat beyond the last. The simulated executor adds
it to a step whose virtual clock shows such a gap. Torch-free.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from heddle.errors import HeddleError
from heddle.sim.cost_model import CostModel, StepShape

# A gap at or under this is back to back: the engine's own time between two steps.
BACK_TO_BACK_S = 5e-4
DEFAULT_GAPS_S = (0.001, 0.01, 0.1, 1.0)


@dataclass(frozen=True, slots=True)
class IdleWarmup:
    """`extra[i]` seconds are added to a step after an idle gap of `gaps[i]` seconds."""

    gaps: tuple[float, ...]
    extra: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.gaps or len(self.gaps) != len(self.extra):
            raise HeddleError("an idle warm-up needs one extra time per gap, at least one gap")
        if any(b <= a for a, b in zip(self.gaps, self.gaps[1:], strict=False)):
            raise HeddleError(f"idle warm-up gaps must increase: {self.gaps}")
        if self.gaps[0] <= BACK_TO_BACK_S:
            raise HeddleError(f"idle warm-up gaps must exceed {BACK_TO_BACK_S} s: {self.gaps}")
        if any(e < 0 or not math.isfinite(e) for e in self.extra):
            raise HeddleError(f"idle warm-up times must be finite and >= 0: {self.extra}")

    def time(self, gap: float | None) -> float:
        """Extra seconds after `gap` idle seconds (None: the first step, as after the longest
        gap measured)."""
        if gap is None or gap >= self.gaps[-1]:
            return self.extra[-1]
        if gap <= BACK_TO_BACK_S:
            return 0.0
        # Linear in log(gap) from (BACK_TO_BACK_S, 0) through the measured points.
        xs = (BACK_TO_BACK_S, *self.gaps)
        ys = (0.0, *self.extra)
        for i in range(1, len(xs)):
            if gap <= xs[i]:
                lo, hi = math.log(xs[i - 1]), math.log(xs[i])
                w = (math.log(gap) - lo) / (hi - lo)
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        return self.extra[-1]  # not reached: gap < gaps[-1]

    def lines(self) -> list[str]:
        return [
            "idle warm-up (extra ms per step after an idle gap): "
            + ", ".join(
                f"{_gap_name(g)}: {1e3 * e:.2f}" for g, e in zip(self.gaps, self.extra, strict=True)
            )
        ]

    def to_json(self) -> dict[str, list[float]]:
        return {"gaps": list(self.gaps), "extra": list(self.extra)}

    @classmethod
    def from_json(cls, data: dict[str, Sequence[float]]) -> IdleWarmup:
        try:
            gaps, extra = data["gaps"], data["extra"]
            return cls(tuple(float(g) for g in gaps), tuple(float(e) for e in extra))
        except (KeyError, TypeError, ValueError) as e:
            raise HeddleError(f"malformed idle warm-up {data!r}: {e}") from e


def _gap_name(gap: float) -> str:
    return f"{1e3 * gap:g} ms" if gap < 1 else f"{gap:g} s"


def fit_warmup(points: Sequence[tuple[float, float]], gaps: Sequence[float]) -> IdleWarmup:
    """The median extra seconds per gap bin: `points` are (idle gap, measured - back-to-back
    seconds); a point joins the measured gap nearest it in log scale (gaps under
    BACK_TO_BACK_S are back to back and ignored). A bin with no point takes its neighbour's
    value; medians under zero (noise around no effect) become zero."""
    gaps = tuple(sorted(gaps))
    bins: list[list[float]] = [[] for _ in gaps]
    for gap, extra in points:
        if gap <= BACK_TO_BACK_S:
            continue
        nearest = min(range(len(gaps)), key=lambda i: abs(math.log(gap) - math.log(gaps[i])))
        bins[nearest].append(extra)
    if not any(bins):
        raise HeddleError("no step followed an idle gap: cannot fit an idle warm-up")
    medians: list[float | None] = [statistics.median(b) if b else None for b in bins]
    filled = _fill(medians)
    return IdleWarmup(gaps, tuple(max(0.0, e) for e in filled))


def _fill(values: list[float | None]) -> list[float]:
    """Each missing value takes the nearest known one (the earlier on ties)."""
    known = [i for i, v in enumerate(values) if v is not None]
    out = []
    for i, v in enumerate(values):
        if v is None:
            j = min(known, key=lambda k: (abs(k - i), k))
            v = values[j]
        assert v is not None
        out.append(v)
    return out


def fit_warmup_from_run(
    model: CostModel,
    steps: Sequence[tuple[StepShape, float]],
    gaps: Sequence[float | None],
    warmup_gaps: Sequence[float] = DEFAULT_GAPS_S,
) -> tuple[IdleWarmup, dict[str, float]]:
    """The warm-up of a recorded run: how much longer than `model` (fit to its back-to-back
    steps) each step after an idle gap took. Checked by fitting it to every other such step
    and predicting the rest: median |error| of those steps with the warm-up and without."""
    idle = [(gap, shape, seconds) for (shape, seconds), gap in zip(steps, gaps, strict=True)
            if gap is not None and gap > BACK_TO_BACK_S]  # fmt: skip
    if len(idle) < 2:
        raise HeddleError(f"{len(idle)} steps followed an idle gap: cannot fit an idle warm-up")
    points = [(gap, seconds - model.step_time(shape)) for gap, shape, seconds in idle]
    warmup = fit_warmup(points, warmup_gaps)
    train = fit_warmup(points[::2], warmup_gaps)
    with_errors, without_errors = [], []
    for gap, shape, seconds in idle[1::2]:
        base = model.step_time(shape)
        with_errors.append(abs(base + train.time(gap) - seconds) / seconds)
        without_errors.append(abs(base - seconds) / seconds)
    check = {
        "num_idle_steps": float(len(idle)),
        "held_out_median_abs_with": statistics.median(with_errors),
        "held_out_median_abs_without": statistics.median(without_errors),
    }
    return warmup, check
