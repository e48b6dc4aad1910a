"""Smoke test of benchmarks/steady_state.py: one point per variant on a handful of requests,
the JSON it resumes from and the table it prints."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


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


def test_a_cut_run_measures_the_window_as_the_drained_run_does(tmp_path):
    import steady_state

    drained, cut = (
        steady_state.Point("long-prompt", "fcfs", "default", 3.0, 120, 0, cut) for cut in (0, 1)
    )
    rows = steady_state.run_all([drained, cut], tmp_path / "t.json", jobs=1, resume=False)
    full, short = rows[0]["overall"], rows[1]["overall"]
    # The window ends at the last arrival: what is done in it does not depend on the drain.
    assert short["total_token_throughput"] == full["total_token_throughput"] > 0
    assert short["offered"] == full["offered"]
    assert full["unfinished"] == 0 < short["unfinished"]  # at 3x the queue is long at the cut
    assert rows[1]["virtual_seconds"] < rows[0]["virtual_seconds"]
    assert rows[1]["steps"]["busy"] == pytest.approx(1.0, abs=0.05)  # overloaded: never idle
    text = steady_state.throughput_table(rows)
    assert "| long-prompt | 3 | 120 | fcfs | default | 2 | " in text and "| 1.000 ± 0.000 " in text


def test_bursts_are_reported_per_phase(tmp_path):
    import steady_state

    arrival = "burst:peak=3,peak_seconds=1,calm=0.5,calm_seconds=1,start_seconds=0.5"
    point = steady_state.Point("chat", "fcfs", "default", 1.0, 120, 0, arrival=arrival)
    (row,) = steady_state.run_all([point], tmp_path / "b.json", jobs=1, resume=False)
    assert sorted(row["phases"]) == ["burst", "calm"]
    offered = sum(p["overall"]["offered"] for p in row["phases"].values())
    assert offered == 120  # every arrival is in one phase
    assert "| chat | fcfs | default | " + arrival + " | burst | 1 |" in steady_state.phase_table(
        [row]
    )


def test_the_grid_lists_what_is_missing():
    import steady_state

    def row(workload, load, policy, variant="default", options=()):
        point = steady_state.Point(workload, policy, variant, load, 30000, 0, True)
        point_dict = steady_state.asdict(point)
        point_dict["policy_options"] = list(options)
        return {"point": point_dict}

    rows = [
        row("chat", 1.5, "fcfs"),
        row("chat", 3.0, "fcfs"),
        row("chat", 3.0, "lanes", options=[("long_delay_seconds", 10)]),  # not default options
        row("chat", 1.5, "lanes", variant="shed"),  # not the default variant
    ]
    text = steady_state.missing_points(rows, ("chat",), (1.5, 3.0), ("fcfs", "lanes"))
    assert (
        text
        == "30000 requests: 2 of 4 points done; missing: chat at 1.5x: lanes; chat at 3x: lanes."
    )
    rows.append(row("chat", 1.5, "lanes"))
    rows.append(row("chat", 3.0, "lanes"))
    assert steady_state.missing_points(rows, ("chat",), (1.5, 3.0), ("fcfs", "lanes")) == (
        "30000 requests: 4 of 4 points done, none missing."
    )


def test_resume_keeps_the_rows_of_other_commands(tmp_path):
    import steady_state

    path = tmp_path / "r.json"
    first = steady_state.Point("chat", "fcfs", "default", 3.0, 40, 0)
    second = steady_state.Point("chat", "fcfs", "default", 1.5, 40, 0)
    steady_state.run_all([first], path, jobs=1, resume=True)
    rows = steady_state.run_all([second], path, jobs=1, resume=True)
    assert [r["point"]["load"] for r in rows] == [1.5]  # what this command asked for
    saved = json.loads(path.read_text())["rows"]
    assert [r["point"]["load"] for r in saved] == [1.5, 3.0]  # the first command's row stays
