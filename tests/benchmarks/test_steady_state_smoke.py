"""Smoke test of benchmarks/steady_state.py: one point per variant on a handful of requests,
the JSON it resumes from and the table it prints."""

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


def test_points_rows_and_table(tmp_path):
    import steady_state

    points = [
        steady_state.Point("long-prompt", "mlfq", variant, 3.0, 40, 0)
        for variant in ("no-guard", "default", "shed")
    ]
    path = tmp_path / "h.json"
    rows = steady_state.run_all(points, path, jobs=1, resume=False)
    assert [r["point"]["variant"] for r in rows] == ["no-guard", "default", "shed"]
    for row in rows:
        overall = row["overall"]
        assert overall["offered"] >= overall["completed"] > 0
        assert row["short"]["offered"] <= overall["offered"]
        start, end = row["window"][0]
        assert 0 < start < end  # the warm-up is cut
    assert rows[0]["overall"]["refused"] == 0
    assert rows[2]["admission"]  # the shedder reported per class
    # Resumed: nothing reruns, the same rows come back.
    again = steady_state.run_all(points, path, jobs=1, resume=True)
    assert json.dumps(again, sort_keys=True) == json.dumps(rows, sort_keys=True)
    text = steady_state.table(rows, "num_requests")
    assert text.count("\n") == 1 + len(rows)
    assert "| long-prompt | mlfq | shed | 40 | 1 |" in text
