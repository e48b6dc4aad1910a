from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import numpy as np
import pytest

from heddle.metrics import SLO, LatencyStats, RequestRecord, meets_slo, percentile, summarize
from heddle.metrics.record import TokenTimeline, TokenTimes

from .factories import make_record


def test_percentile_exact_values() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_percentile_matches_numpy() -> None:
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 99.9, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_latency_stats_skip_none() -> None:
    stats = LatencyStats.of([3.0, None, 1.0, 2.0])
    assert (stats.count, stats.mean, stats.p50, stats.max) == (3, 2.0, 2.0, 3.0)
    assert LatencyStats.of([None]) == LatencyStats()


def records() -> list[RequestRecord]:
    return [
        # ttft 0.5, tpot 0.25, e2e 1.0, queue 0.25, itls 0.25, 0.25
        make_record("r1", 0.0, 0.25, [0.5, 0.75, 1.0], 1.0, request_class="a", stall_time=0.25),
        # ttft 0.25, tpot 0.5, e2e 0.75, queue 0
        make_record("r2", 1.0, 1.0, [1.25, 1.75], 1.75, request_class="a", num_preemptions=1),
        # ttft 0.5, no tpot, e2e 0.5, queue 0.25
        make_record("r3", 0.5, 0.75, [1.0], 1.0, request_class="b", prompt=5),
        make_record("r4", 0.25, None, [], 0.5, request_class="b", reason="abort"),
        make_record("r5", 1.5, None, [], None, request_class="b"),  # still waiting
    ]


def test_summary_exact_values() -> None:
    assert summarize(records()).duration == 1.75  # first arrival .. last finish
    s = summarize(records(), duration=2.0)
    assert s.duration == 2.0
    o = s.overall
    assert (o.num_requests, o.num_completed, o.num_failed, o.num_unfinished) == (5, 3, 1, 1)
    assert o.num_preemptions == 1
    assert (o.num_prompt_tokens, o.num_output_tokens) == (25, 6)
    assert o.ttft == LatencyStats(3, 1.25 / 3, 0.5, 0.5, 0.5, 0.5)
    assert o.tpot.count == 2 and o.tpot.mean == 0.375 and o.tpot.p50 == 0.375
    assert o.tpot.p90 == pytest.approx(0.475)
    # e2e sorted [0.5, 0.75, 1.0]
    assert (o.e2e.p50, o.e2e.max) == (0.75, 1.0)
    assert o.e2e.p90 == pytest.approx(0.95)
    assert o.e2e.p99 == pytest.approx(0.995)
    assert o.itl.count == 3 and o.itl.mean == pytest.approx(1 / 3)
    assert o.queue_time.mean == pytest.approx(0.5 / 3)
    assert o.stall_time.max == 0.25
    assert o.request_throughput == 3 / 2.0
    assert o.output_throughput == 6 / 2.0
    assert o.total_token_throughput == 31 / 2.0
    assert o.goodput is None and o.num_within_slo is None
    assert list(s.classes) == ["a", "b"]
    a, b = s.classes["a"], s.classes["b"]
    assert (a.num_requests, a.num_completed, a.num_failed, a.num_preemptions) == (2, 2, 0, 1)
    assert (b.num_requests, b.num_completed, b.num_failed, b.num_unfinished) == (3, 1, 1, 1)
    assert a.request_throughput + b.request_throughput == o.request_throughput
    assert b.tpot == LatencyStats()


def test_span_ends_at_last_finish() -> None:
    late = make_record("late", 3.0, 3.0, [3.5], None)  # unfinished: its last token counts
    assert summarize([*records(), late]).duration == 3.5
    assert summarize(records(), duration=7.0).duration == 7.0
    assert summarize([]).overall.request_throughput == 0.0


def test_goodput_counts_exactly_requests_within_slo() -> None:
    rs = records()
    s = summarize(rs, slo=SLO(ttft=0.4, tpot=0.3))
    # r1 ttft 0.5 > 0.4; r2 tpot 0.5 > 0.3; r3 ttft 0.5 > 0.4
    assert s.overall.num_within_slo == 0 and s.overall.goodput == 0.0
    rs[2].ttft_slo = 0.6  # r3's own TTFT target overrides; it has no TPOT
    rs[1].tpot_slo = 0.5
    s = summarize(rs, duration=2.0, slo=SLO(ttft=0.4, tpot=0.3))
    assert s.overall.num_within_slo == 2
    assert s.overall.goodput == 2 / 2.0
    assert s.overall.slo_attainment == pytest.approx(2 / 3)
    assert (s.classes["a"].num_within_slo, s.classes["b"].num_within_slo) == (1, 1)
    # Per-request SLOs alone turn goodput on; unconstrained requests count as good.
    s = summarize(rs)
    assert s.overall.num_within_slo == 3


def test_slo_boundaries() -> None:
    r = make_record("r", 0.0, 0.0, [0.5, 1.0], 1.0)
    assert meets_slo(r, SLO(ttft=0.5, tpot=0.5))
    assert not meets_slo(r, SLO(ttft=0.49))
    assert not meets_slo(make_record("x", 0.0, 0.0, [], 1.0), SLO(ttft=1.0))
    assert meets_slo(r, None)
    with pytest.raises(ValueError):
        SLO(ttft=0.0)


def test_to_dict_is_json_ready() -> None:
    import json

    s = summarize(records(), slo=SLO(ttft=1.0))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["slo"] == {"ttft": 1.0, "tpot": None}
    assert data["overall"]["ttft"]["p50"] == 0.5
    assert data["classes"]["b"]["num_failed"] == 1
    assert data["overall"]["slo_attainment"] == 1.0


def test_one_class_overall_is_that_class_renamed() -> None:
    """One request class: the overall row is the class's row (computed once), named "all"."""
    one = [r for r in records() if r.request_class == "b"]
    s = summarize(one, duration=2.0)
    (b,) = s.classes.values()
    assert s.overall.request_class == "all" and b.request_class == "b"
    assert s.overall == dataclasses.replace(b, request_class="all")
    assert (s.overall.num_requests, s.overall.num_completed, s.overall.num_unfinished) == (3, 1, 1)


def test_itl_counted_per_step_equals_itl_listed() -> None:
    """The ITL stats count gaps per timeline step (numpy columns); they are the same numbers
    `LatencyStats.of` gives for every record's gaps listed one by one, gaps between runs and
    records off a timeline included."""
    rng = random.Random(3)
    timeline = TokenTimeline()
    for _ in range(60):
        timeline.append(len(timeline) * 0.01 + rng.choice([0.0, 0.003, 0.0071]))
    recs = []
    for i in range(40):
        times = TokenTimes(timeline)
        for index in sorted(rng.sample(range(60), rng.randint(1, 30))):
            times.add(index)
        recs.append(RequestRecord(f"r{i}", 0.0, 4, token_times=times, finish_time=1.0))
    recs.append(RequestRecord("own", 0.0, 4, token_times=[0.1, 0.25, 0.3], finish_time=1.0))
    listed = LatencyStats.of(gap for r in recs for gap in r.itls)
    assert listed.count > 100
    assert summarize(recs).overall.itl == listed


def test_of_counts_mean_is_the_exact_sum() -> None:
    # counts past 2**26 take the split's high terms; the mean is the correctly rounded sum
    values, counts = [0.1, 0.3, 0.7], [1, 2**40 + 3, 5]
    stats = LatencyStats.of_counts(values, counts)
    exact = sum(Fraction(v) * c for v, c in zip(values, counts, strict=True))
    assert stats.count == sum(counts)
    assert stats.mean == float(exact) / sum(counts)
    assert (stats.p50, stats.p99, stats.max) == (0.3, 0.3, 0.7)
    assert LatencyStats.of_counts([0.5, 0.2], [0, 0]) == LatencyStats()
