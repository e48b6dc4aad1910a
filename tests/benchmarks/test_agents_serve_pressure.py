"""benchmarks/agents_serve.py's reading of a run: the pool's use and the waiting queue over the
arrival window from /health samples, and the first and second half of the programs by arrival
(a queue that grows through the run makes the second half slower)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def test_pressure_over_the_arrival_window():
    from agents_serve import pressure

    # (seconds, blocks used, running, waiting); arrivals span 1..4 s: samples at 0 and 9 are out.
    samples = [[0, 0, 0, 0], [1, 95, 4, 2], [2, 50, 3, 0], [3, 100, 4, 1], [4, 10, 1, 0],
               [9, 100, 8, 9]]
    records = [
        {"arrival": 1.0, "completion": 2.0, "calls": 1},
        {"arrival": 4.0, "completion": 6.0, "calls": 2},
        {"arrival": 2.0, "completion": 4.0, "calls": 1},
        {"arrival": 3.0, "completion": None, "calls": 0},  # failed: no completion time
    ]
    q = pressure(samples, records, num_blocks=100)
    assert q["mean_used_share"] == pytest.approx((95 + 50 + 100 + 10) / 4 / 100)
    assert q["full_share"] == 0.5 and q["waiting_share"] == 0.5
    assert q["full_and_waiting_share"] == 0.5 and q["mean_waiting"] == 0.75
    assert q["pct_first_half"] == 3.0  # arrivals 1 and 2
    assert q["pct_second_half"] == 6.0  # arrival 3 failed; arrival 4
    assert pressure([], records, 100) == {}
