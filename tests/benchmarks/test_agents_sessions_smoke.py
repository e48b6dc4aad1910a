"""Smoke test of benchmarks/agents_sessions.py sim: a few SWE-like programs with lru and with
cost + the second tier, the steady window and the JSON it writes (virtual clock, seconds)."""

from __future__ import annotations

import json
import statistics
import sys

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def test_sim_points_with_the_second_tier(tmp_path, monkeypatch):
    import agents_sessions

    monkeypatch.setattr(sys, "argv", [
        "agents_sessions.py", "sim", "--workloads", "agent-swe", "--loads", "2",
        "--num-programs", "6", "--num-blocks", "600", "--offload-blocks", "400",
        "--workload-option", "length_scale=0.2", "--configs", "fcfs:lru,fcfs:cost+tier",
        "--seeds", "0,1", "--output-dir", str(tmp_path), "--tag", "_t",
    ])
    agents_sessions.main()
    data = json.loads((tmp_path / "agents-sim_t.json").read_text())
    points = data["points"]
    assert [(p["seed"], p["retention"]) for p in points] == [
        (0, "lru"), (0, "cost+tier"), (1, "lru"), (1, "cost+tier")
    ]
    for point in points:
        assert point["completed"] == 6
        assert 0 < point["steady_programs"] <= 6
    tiered = [p for p in points if p["retention"] == "cost+tier"]
    assert all(p["offload_blocks"] == 400 for p in tiered)
    assert all("blocks_offloaded" in p["tier"] for p in tiered)
    assert all(p["leaked_blocks"] == 0 and p["leaked_tier_slots"] == 0 for p in points)


def _run_file(path, seed, n, means):
    points = [
        {"workload": "agent-swe", "load": 0.3, "seed": seed, "num_programs": n,
         "policy": "fcfs", "retention": retention, "pct_mean": mean}
        for retention, mean in means.items()
    ]
    setup = "simulator: llama-3.1-8b on one h100 (roofline), 8000 KV blocks of 16 tokens"
    path.write_text(json.dumps({"setup": setup, "points": points}))
    return str(path)


def test_by_seed_marks_growth_and_counts_only_steady_seeds(tmp_path):
    import agents_sessions

    files = [
        # seed 0: lru grows 1.5x from 180 to 360 programs (a queue that grows: not steady)
        _run_file(tmp_path / "a.json", 0, 180, {"lru": 100.0, "cost+tier": 50.0}),
        _run_file(tmp_path / "b.json", 0, 360, {"lru": 150.0, "cost+tier": 52.0}),
        # seed 1: both steady
        _run_file(tmp_path / "c.json", 1, 180, {"lru": 60.0, "cost+tier": 40.0}),
        _run_file(tmp_path / "d.json", 1, 360, {"lru": 63.0, "cost+tier": 42.0}),
    ]
    text = agents_sessions.by_seed(files)
    rows = {line.split("|")[4].strip(): line for line in text.splitlines()
            if line.startswith("| agent-swe | 0.3 | 8000 | ")}
    assert "100.0 / 150.0 (x1.50*)" in rows["0"]
    assert "2.88x*" in rows["0"]  # 150 / 52 at 360 programs, not a steady verdict
    assert "1.50x" in rows["1"] and "1.50x*" not in rows["1"]  # 63 / 42
    summary = [line for line in text.splitlines() if "fcfs+cost+tier | 2 |" in line]
    assert summary and "1: 1.50x (1.50-1.50)" in summary[0]


def _queue_point(retention, n, pct_mean, waiting_early, waiting_late):
    """A 0.5 programs/s run of n programs whose queue waits `waiting_early` requests over the
    first 60% of its arrival span and `waiting_late` after."""
    span = (n - 1) / 0.5  # the last arrival
    samples = [(t, 0.5, waiting_early if t < 0.6 * span else waiting_late, 10)
               for t in range(0, int(span))]
    return {"workload": "agent-swe", "load": 0.5, "seed": 0, "num_programs": n,
            "policy": "fcfs", "retention": retention, "pct_mean": pct_mean,
            "pct_p95": 2 * pct_mean, "tokens_recomputed": 1000 * n,
            "queue_series": samples,
            "program_series": [(i / 0.5, pct_mean, 10.0) for i in range(n)]}


def test_horizon_judges_steadiness_by_the_queue_not_by_the_mean(tmp_path):
    import agents_sessions

    setup = "simulator: llama-3.1-8b on one h100 (roofline), 8000 KV blocks of 16 tokens"
    points = [
        # lru's queue grows (0 early, 30 late): past capacity, though its mean grows only 5%
        _queue_point("lru", 100, 80.0, 0, 1), _queue_point("lru", 300, 84.0, 0, 30),
        # cost+tier's mean grows 25% (a heavier mix later on), its queue stays empty: steady
        _queue_point("cost+tier", 100, 40.0, 0, 0),
        _queue_point("cost+tier", 300, 50.0, 1, 0),
    ]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"setup": setup, "points": points}))
    text = agents_sessions.horizon([str(path)])
    rows = {line.split("|")[5].strip(): line for line in text.splitlines()
            if line.startswith("| agent-swe") and "x |" not in line and "capacity" not in line}
    assert rows["fcfs+lru"].rstrip(" |").endswith("no")
    assert "0.0 / 30.0 / 30.0 (30), 300" in rows["fcfs+lru"]
    assert rows["fcfs+cost+tier"].rstrip(" |").endswith("yes")
    assert "100: 40.0 → 300: 50.0 (x1.25)" in rows["fcfs+cost+tier"]
    verdict = [line for line in text.splitlines() if "capacity" in line]
    assert len(verdict) == 1
    assert "100: 2.00x / 300: 1.68x" in verdict[0]  # 80/40, 84/50
    assert "1.68x, 1.0x" in verdict[0]  # p95 ratio, recomputed ratio at 300 programs


def test_windows_follow_the_ratio_through_the_longest_run(tmp_path):
    import agents_sessions

    def point(retention, pcts, waiting):
        n = len(pcts)
        return {"workload": "agent-swe", "load": 0.5, "seed": 0, "num_programs": n,
                "policy": "fcfs", "retention": retention, "pct_mean": statistics.fmean(pcts),
                "queue_series": [(t, 0.5, waiting(t), 4) for t in range(2 * n)],
                "program_series": [(2.0 * i, pct, 1.0) for i, pct in enumerate(pcts)]}

    # 6 programs, windows of 2: lru's PCT climbs (10, 10, 30, 30, 90, 90) and its queue grows
    # from 0 to 20 waiting; cost+tier stays at 10 s with nothing waiting
    lru = point("lru", [10, 10, 30, 30, 90, 90], lambda t: 0 if t < 6 else 20)
    cost = point("cost+tier", [10.0] * 6, lambda t: 0)
    path = tmp_path / "runs.json"
    setup = "simulator: llama-3.1-8b on one h100 (roofline), 8000 KV blocks of 16 tokens"
    path.write_text(json.dumps({"setup": setup, "points": [lru, cost]}))
    text = agents_sessions.windows([str(path)], every=2, at=2.0)
    row = [line for line in text.splitlines() if "| 0 | fcfs+cost+tier |" in line]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].split("|")]
    assert cells[6] == "6"
    assert cells[7] == "2: 1.00x / 4: 2.00x / 6: 4.33x"  # 10/10, 20/10, 43.3/10
    assert cells[8] == "1.00x / 3.00x / 9.00x"
    assert cells[9] == "0.0 / 10.0 / 20.0 ; 0.0 / 0.0 / 0.0"  # t in [0,4), [4,8), [8,12)
    assert cells[10] == "4" and cells[11] == "capacity"
    summary = [line for line in text.splitlines() if line.startswith("| agent-swe | 0.5 | 8000 |")]
    assert summary[-1].endswith("| 6 | 1 | - | s0 4.33x (4) | - |")
    # a ratio that ends below the bar is never held
    assert "| never |" in agents_sessions.windows([str(path)], every=2, at=5.0)
    with pytest.raises(SystemExit, match="--every"):
        agents_sessions.windows([str(path)], every=0)


def test_a_burst_that_drains_before_the_arrivals_end_is_steady():
    import agents_sessions

    def point(waiting):
        return {"num_programs": 100, "load": 1.0, "queue_series": [
            (t, 0.5, waiting(t), 4) for t in range(100)]}

    # 0-2 waiting, a burst of 30 over 60-80% of the arrivals, drained to 1 by the last 20%
    burst = agents_sessions._waiting(point(lambda t: 30 if 60 <= t < 80 else t % 3))
    about_one = pytest.approx(1.0, abs=0.05)
    assert burst == (about_one, pytest.approx(15.5), about_one, 30)
    assert agents_sessions._queue_steady(burst)
    # the same queue still 30 deep at the end: it grows
    grows = agents_sessions._waiting(point(lambda t: 30 if t >= 60 else t % 3))
    assert grows[1:3] == (30.0, 30.0) and not agents_sessions._queue_steady(grows)
    # a long queue that stays as long is steady; one that grows past 1.25x of it is not
    assert agents_sessions._queue_steady((10.0, 12.0, 12.0, 20))
    assert not agents_sessions._queue_steady((10.0, 13.0, 13.0, 20))
