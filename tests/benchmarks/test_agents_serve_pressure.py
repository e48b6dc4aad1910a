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


def test_a_real_run_is_judged_by_its_queue_like_a_simulated_one(tmp_path):
    import argparse
    import json

    from agents_serve import as_point
    from agents_sessions import windows

    args = argparse.Namespace(workload="agent-swe", request_rate=1.0, num_blocks=100)

    def row(config, pct, waiting_late):
        records = [{"arrival": float(i), "completion": pct, "calls": 2} for i in range(40)]
        # (seconds since the sampler started, blocks used, running, waiting); the load client
        # started 0.5 s after the sampler, so the samples move back by 0.5 s.
        samples = [[t + 0.5, 50, 4, 1 if t < 20 else waiting_late] for t in range(40)]
        return {"config": config, "seed": 0, "program_records": records,
                "engine_samples": samples, "sample_offset": 0.5,
                "programs": {"completion_time": {"mean": pct, "p95": pct}}}

    steady_lru, growing_lru = row("fcfs:lru", 6.0, 1), row("fcfs:lru", 6.0, 30)
    mine = row("plas:cost+tier", 4.0, 1)
    point = as_point(mine, args)
    assert point["workload"] == "agent-swe (real)" and point["retention"] == "cost+tier"
    assert point["queue_series"][0] == (0.0, 0.5, 1, 4)  # shifted, share of the pool
    for name, lru, verdict in (("a", steady_lru, "steady (both)"), ("b", growing_lru, "capacity")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"setup": "real engine, 100 KV blocks",
                                    "points": [as_point(lru, args), point]}))
        table = windows([str(path)], every=20, at=1.5)
        assert "| agent-swe (real) | 1 | 100 | 0 | plas+cost+tier | 40 | 20: 1.50x / 40: 1.50x" \
            in table
        assert f"| 20 | {verdict} |" in table
