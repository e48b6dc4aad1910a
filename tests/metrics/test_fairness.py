from __future__ import annotations

import pytest

from heddle.metrics import fairness

from .factories import make_record


def two_users() -> list:
    return [
        # A: 10 prompt tokens served over [0, 1]; output tokens at 1.0 .. 3.5, finish 4.
        make_record("a1", 0.0, 0.0, [1.0, 1.5, 2.0, 2.5, 3.0, 3.5], 4.0, user="A", prompt=10),
        # B: 4 prompt tokens over [1, 2]; output tokens at 2.0 and 3.0, finish 4.
        make_record("b1", 0.0, 1.0, [2.0, 3.0], 4.0, user="B", prompt=4),
        # C is in the system only during [2.5, 3.2]: never backlogged for a whole window.
        make_record("c1", 2.5, 2.5, [3.1], 3.2, user="C", prompt=1),
    ]


def test_two_user_service_and_max_difference() -> None:
    report = fairness(two_users(), window=1.0)
    assert report.users["A"].service == 10 + 2 * 6
    assert report.users["B"].service == 4 + 2 * 2
    assert report.users["C"].service == 1 + 2
    assert [w.service["A"] for w in report.windows] == [10.0, 4.0, 4.0, 4.0]
    assert [w.service["B"] for w in report.windows] == [0.0, 4.0, 2.0, 2.0]
    assert [w.backlogged for w in report.windows] == [["A", "B"]] * 4
    assert report.max_service_difference == 10.0
    assert report.max_difference_window == (0.0, 1.0)
    assert report.max_difference_users == ("A", "B")
    assert report.num_windows_compared == 4
    services = [22, 8, 3]
    expected = sum(services) ** 2 / (3 * sum(s * s for s in services))
    assert report.jain_index == pytest.approx(expected)


def test_weights_are_parameters() -> None:
    report = fairness(two_users(), window=1.0, prompt_weight=0.0, output_weight=1.0)
    assert report.users["A"].service == 6
    assert [w.service["A"] - w.service["B"] for w in report.windows] == [0.0, 2.0, 1.0, 1.0]
    assert report.max_service_difference == 2.0
    assert report.max_difference_window == (1.0, 2.0)


def test_prompt_service_spread_over_prefill() -> None:
    # 8 prompt tokens prefilled over [0.5, 2.5]: a quarter in the first window.
    rs = [make_record("a", 0.0, 0.5, [2.5], 3.0, user="A", prompt=8)]
    report = fairness(rs, window=1.0, output_weight=0.0)
    assert [w.service["A"] for w in report.windows] == [2.0, 4.0, 2.0]
    assert report.num_windows_compared == 0 and report.max_difference_users is None


def test_default_window_and_anonymous_user() -> None:
    rs = [make_record("x", 0.0, 0.0, [1.0, 2.0], 2.0)]
    report = fairness(rs, num_windows=4)
    assert report.window == 0.5 and len(report.windows) == 4
    assert list(report.users) == ["anonymous"]
    assert fairness([]).users == {}
