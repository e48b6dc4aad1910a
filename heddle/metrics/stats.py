"""Percentiles and the mean/p50/p90/p99/max summary of one latency metric."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy


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

    @classmethod
    def of_counts(
        cls, values: Sequence[float] | numpy.ndarray, counts: Sequence[int] | numpy.ndarray
    ) -> LatencyStats:
        """Stats of a multiset given as columns, value i `counts[i]` times: the same numbers
        `of` gives for the values listed one by one (the mean is the correctly rounded sum, as
        fsum's). numpy sorts and counts; the percentiles' arithmetic is `of`'s, on floats."""
        value_column = numpy.asarray(values, dtype=numpy.float64)
        count_column = numpy.asarray(counts, dtype=numpy.int64)
        present = count_column > 0
        order = numpy.argsort(value_column[present], kind="stable")
        value_column = value_column[present][order]
        count_column = count_column[present][order]
        if not len(value_column):
            return cls()
        ends = numpy.cumsum(count_column)  # ends[i]: how many values are <= the i-th
        total = int(ends[-1])

        def at(rank: int) -> float:
            return float(value_column[int(numpy.searchsorted(ends, rank, side="right"))])

        def percentile_of(q: float) -> float:
            rank = q / 100.0 * (total - 1)
            lo = math.floor(rank)
            hi = min(lo + 1, total - 1)
            low = at(lo)
            return low + (at(hi) - low) * (rank - lo)

        return cls(
            count=total,
            mean=_exact_weighted_sum(value_column, count_column) / total,
            p50=percentile_of(50),
            p90=percentile_of(90),
            p99=percentile_of(99),
            max=float(value_column[-1]),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's splitter for doubles


def _exact_weighted_sum(values: numpy.ndarray, counts: numpy.ndarray) -> float:
    """sum(value * count), correctly rounded: each product is split into terms that are exact
    (a 26-bit half of the value times a 26-bit part of the count) and fsum adds them. numpy's
    float64 operations round as Python's do, one operation at a time."""
    scaled = values * _SPLIT
    high = scaled - (scaled - values)  # the upper 26 bits of each value
    low = values - high
    count_low = (counts & 0x3FFFFFF).astype(numpy.float64)
    count_high = (counts >> 26).astype(numpy.float64)
    terms = [high * count_low, low * count_low]
    big = count_high > 0
    if big.any():
        terms += [
            high[big] * count_high[big] * 67108864.0,
            low[big] * count_high[big] * 67108864.0,
        ]
    return math.fsum(numpy.concatenate(terms).tolist())
