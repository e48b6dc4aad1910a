from __future__ import annotations

import pytest

from heddle.metrics import SLO
from heddle.metrics.steady import (
    Refused,
    interval,
    phase_reports,
    steady_window,
    window_report,
)
from tests.metrics.factories import make_record


def _queue_growing(n: int, gap: float, service: float):
    """One server, FIFO, arrivals every `gap` s, each request 2 tokens `service` s apart: when
    service > gap the queue grows and TTFT rises by (service - gap) per arrival."""
    records, free = [], 0.0
    for i in range(n):
        arrival = i * gap
        start = max(arrival, free)
        tokens = [start + service / 2, start + service]
        free = start + service
        records.append(make_record(f"r{i}", arrival, start, tokens, free, prompt=5))
    return records


def test_the_window_skips_the_warmup_and_the_drain() -> None:
    records = _queue_growing(11, gap=1.0, service=1.0)
    start, end = steady_window(records, warmup_fraction=0.2)
    assert start == pytest.approx(2.0) and end == pytest.approx(10.0)
    report = window_report(records, intervals=[(2.0, 10.0)])
    overall = report.overall
    assert report.duration == 8.0
    assert overall.offered == 8 and overall.completed == 8  # arrivals at 2..9
    # Tokens inside [2, 10): two per second; prompts counted at first tokens 2.5..9.5.
    assert overall.output_throughput == pytest.approx(2.0)
    assert overall.total_token_throughput == pytest.approx(2.0 + 5.0)
    assert overall.request_throughput == pytest.approx(1.0)  # finishes at 3..10 -> 3..9
    assert overall.ttft_trend == pytest.approx(0.0)


def test_a_growing_queue_shows_in_the_trend() -> None:
    records = _queue_growing(50, gap=1.0, service=1.5)
    report = window_report(records, warmup_fraction=0.2)
    # The queueing delay grows by 0.5 s per 1 s of arrivals.
    assert report.overall.ttft_trend == pytest.approx(0.5)
    stable = window_report(_queue_growing(50, gap=1.0, service=0.8), warmup_fraction=0.2)
    assert stable.overall.ttft_trend == pytest.approx(0.0)


def test_goodput_counts_arrivals_in_slo_and_refusals_as_offered() -> None:
    records = [
        make_record("a", 0.0, 0.0, [0.1, 0.2], 0.2, ttft_slo=0.5),
        make_record("b", 1.0, 1.0, [1.9, 2.0], 2.0, ttft_slo=0.5),  # late first token
        make_record("c", 2.0, 2.0, [2.1], 2.1, request_class="x"),
    ]
    refused = [Refused("d", 1.5, "default", "seats"), Refused("e", 9.0, "default", "seats")]
    report = window_report(records, refused, intervals=[(0.0, 4.0)], slo=SLO(ttft=1.0))
    default = report.classes["default"]
    assert (default.offered, default.refused, default.completed) == (3, 1, 2)
    assert default.within_slo == 1 and default.goodput == pytest.approx(0.25)
    assert default.slo_attainment == pytest.approx(0.5)
    assert report.classes["x"].within_slo == 1  # the report's SLO: TTFT 0.1 <= 1.0
    assert report.overall.offered == 4


def test_unfinished_requests_enter_the_ttft_censored() -> None:
    records = [
        make_record("done", 0.0, 0.0, [1.0, 2.0], 2.0),
        make_record("stuck", 1.0, None, [], None),
    ]
    report = window_report(records, intervals=[(0.0, 5.0)])
    assert report.overall.unfinished == 1
    assert report.overall.ttft.max == pytest.approx(1.0)  # run end 2.0 - arrival 1.0
    assert report.overall.ttft.count == 2


def test_a_class_group_row() -> None:
    records = [
        make_record("a", 0.0, 0.0, [0.1], 0.1, request_class="user-1"),
        make_record("b", 0.5, 0.5, [0.6], 0.6, request_class="user-2"),
        make_record("c", 0.5, 0.5, [0.6], 0.6, request_class="flood"),
    ]
    report = window_report(records, intervals=[(0.0, 1.0)], classes=("user-1", "user-2"))
    assert report.classes["user-1+user-2"].offered == 2
    assert list(report.classes)[-1] == "all"


def test_phases_of_a_burst() -> None:
    spec = "burst:start_seconds=2,peak_seconds=1,calm_seconds=2"
    records = [make_record(f"r{i}", t, t, [t + 0.05], t + 0.05) for i, t in enumerate(
        [0.5, 1.5, 2.2, 2.6, 3.5, 4.5, 5.1]
    )]  # fmt: skip
    phases = phase_reports(records, [], spec)
    assert phases["burst"].intervals[0] == pytest.approx((2.0, 3.0))
    assert phases["burst"].overall.offered == 3  # 2.2, 2.6 and 5.1 (the second burst)
    assert phases["calm"].overall.offered == 4
    assert phases["burst"].duration == pytest.approx(1.0 + 0.1)
    assert phases["calm"].intervals == [(0.0, 2.0), (3.0, 5.0)]
    assert list(phase_reports(records, [], "poisson")) == ["sustained"]


def test_interval_over_seeds() -> None:
    one = interval([3.0])
    assert (one.mean, one.low, one.high) == (3.0, 3.0, 3.0)
    three = interval([1.0, 2.0, 3.0])
    assert three.mean == 2.0
    assert three.high - three.mean == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-4)
    assert (three.min, three.max) == (1.0, 3.0)
    assert three.text(".1f") == "2.0 ± 2.5 (1.0–3.0)"
    with pytest.raises(ValueError):
        interval([])
