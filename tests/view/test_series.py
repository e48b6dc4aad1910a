"""The view's step series: exact while small, bucketed by time when asked for fewer points,
merged (older half coarser) when bounded."""

from __future__ import annotations

import pytest

from heddle.view.series import StepRow, StepSeries


def row(step: int, *, batch: int = 2, preempted: int = 0) -> StepRow:
    return StepRow(
        step_id=step,
        start=float(step),
        duration=0.5 + (step % 2) * 0.5,  # 0.5, 1.0, 0.5, ...
        batch=batch,
        prefill={"chat": 10} if step % 2 == 0 else {},
        decode={"chat": batch, "batch": 1},
        running={"chat": batch},
        waiting={"chat": step},
        kv_used={"chat": 4.0},
        kv_free=12,
        kv_cached=3,
        preempted=preempted,
    )


def test_small_window_is_exact() -> None:
    series = StepSeries()
    series.extend(row(i) for i in range(5))
    data = series.window()
    assert data["t"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert data["n"] == [1] * 5 and data["num_steps"] == 5
    assert data["dur"] == [0.5, 1.0, 0.5, 1.0, 0.5]
    assert data["prefill"]["chat"] == [10, 0, 10, 0, 10]
    assert data["waiting"]["chat"] == [0, 1, 2, 3, 4]
    assert data["kv_total"] == 19
    # A class that appears late reads as zero before it appeared.
    series.append(StepRow(5, 5.0, 0.1, 1, {"tool": 3}, {}, {}, {}, {}, 16, 0))
    assert series.window()["prefill"]["tool"] == [0, 0, 0, 0, 0, 3]
    assert series.window(2.0, 3.5)["step_first"] == [2, 3]


def test_bucketed_window_keeps_sums_means_and_maxima() -> None:
    series = StepSeries()
    series.extend(row(i, batch=i, preempted=1 if i == 3 else 0) for i in range(8))
    data = series.window(max_points=2)  # two time bins: steps 0-3 and 4-7
    assert data["n"] == [4, 4]
    assert data["step_first"] == [0, 4] and data["step_last"] == [3, 7]
    assert data["dur"] == [0.75, 0.75]  # mean step time
    assert data["dur_max"] == [1.0, 1.0]
    assert data["batch"] == [1.5, 5.5] and data["batch_max"] == [3, 7]
    assert data["preempted"] == [1, 0]  # summed: the marker survives aggregation
    assert data["prefill"]["chat"] == [5.0, 5.0]  # mean tokens per step
    assert data["num_steps"] == 8


def test_bounded_series_merges_its_older_half() -> None:
    series = StepSeries(capacity=8)
    series.extend(row(i, preempted=1) for i in range(20))
    assert len(series) <= 8
    assert series.num_steps == 20
    data = series.window()
    assert sum(data["n"]) == 20  # every step still counted
    assert sum(data["preempted"]) == 20
    assert data["step_first"][0] == 0 and data["step_last"][-1] == 19
    assert data["n"][-1] == 1  # the newest steps are exact
    assert data["n"][0] > 1  # the oldest are merged
    with pytest.raises(ValueError):
        StepSeries(capacity=2)


def test_rows_round_trip_as_lists() -> None:
    original = row(3)
    assert StepRow.from_list(original.to_list()) == original
