"""Smoke test of benchmarks/agents_sessions.py sim: a few SWE-like programs with lru and with
cost + the second tier, the steady window and the JSON it writes (virtual clock, seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module", autouse=True)
def benchmarks_on_path():
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))


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
