"""Rank agreement of predictions with outcomes: Kendall's tau-b."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two equally long sequences (ties in either counted as in scipy).

    NaN when fewer than two items or when either sequence is constant. O(n^2) in numpy
    chunks: fine for the few thousand requests of a run.
    """
    if len(x) != len(y):
        raise ValueError("x and y must have the same length")
    n = len(x)
    if n < 2:
        return math.nan
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    concordance = 0.0
    x_pairs = y_pairs = 0  # pairs not tied in x, not tied in y
    chunk = max(1, 4_000_000 // n)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        dx = np.sign(a[start:stop, None] - a[None, :])
        dy = np.sign(b[start:stop, None] - b[None, :])
        concordance += float((dx * dy).sum())
        x_pairs += int(np.count_nonzero(dx))
        y_pairs += int(np.count_nonzero(dy))
    # Every unordered pair was counted twice (i, j) and (j, i).
    if x_pairs == 0 or y_pairs == 0:
        return math.nan
    return concordance / math.sqrt(x_pairs * y_pairs)
