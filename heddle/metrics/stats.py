"""Percentiles and the mean/p50/p90/p99/max summary of one latency metric."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks, as
    numpy.percentile's default ("linear") method computes it. `values` must be non-empty."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    frac = rank - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Summary of one metric over some requests (seconds); None where there were no values."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> LatencyStats:
        """Stats of the values that are not None."""
        present = sorted(v for v in values if v is not None)
        if not present:
            return cls()
        return cls(
            count=len(present),
            mean=math.fsum(present) / len(present),
            p50=percentile(present, 50),
            p90=percentile(present, 90),
            p99=percentile(present, 99),
            max=present[-1],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
