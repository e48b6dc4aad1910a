from __future__ import annotations

import argparse
import random

import pytest

from heddle.errors import HeddleError
from heddle.workloads import arrival_times, get_workload, trace
from heddle.workloads.arrivals import arrival_arg, arrival_spec
from heddle.workloads.bursts import (
    BurstProfile,
    DiurnalProfile,
    parse_profile,
    phase_of,
    profile_arrivals,
)


def _rate_in(times: list[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / (end - start)


def test_burst_rates_follow_the_profile() -> None:
    profile = BurstProfile(peak=3.0, peak_seconds=30, calm=0.7, calm_seconds=120, start_seconds=60)
    times = profile_arrivals(profile, 20.0, 12000, random.Random(1))
    assert times[0] == 0.0 and times == sorted(times)
    # calm start, burst 60-90 s, calm 90-210 s, burst 210-240 s
    assert _rate_in(times, 5, 60) == pytest.approx(14.0, rel=0.08)
    assert _rate_in(times, 60, 90) == pytest.approx(60.0, rel=0.08)
    assert _rate_in(times, 90, 210) == pytest.approx(14.0, rel=0.08)
    assert _rate_in(times, 210, 240) == pytest.approx(60.0, rel=0.08)
    assert profile.mean_multiplier == pytest.approx((3 * 30 + 0.7 * 120) / 150)


def test_diurnal_rises_to_its_peak_at_half_period() -> None:
    profile = DiurnalProfile(low=0.5, high=2.0, period=400)
    times = profile_arrivals(profile, 10.0, 8000, random.Random(2))
    trough = _rate_in(times, 0, 40) + _rate_in(times, 360, 400)
    peak = _rate_in(times, 180, 220)
    assert peak == pytest.approx(20.0, rel=0.1)
    assert trough / 2 == pytest.approx(5.4, rel=0.15)  # near low*rate, a little above
    assert profile.multiplier(0) == 0.5 and profile.multiplier(200) == pytest.approx(2.0)
    assert profile.phase(100) == "rising" and profile.phase(300) == "falling"


def test_specs_parse_with_options_and_reject_bad_ones() -> None:
    assert parse_profile("burst") == BurstProfile()
    assert parse_profile("burst:peak=3, calm-seconds=90") == BurstProfile(peak=3, calm_seconds=90)
    assert parse_profile("diurnal:period=60") == DiurnalProfile(period=60)
    for bad in ("burst:peak", "burst:height=2", "burst:peak=x", "diurnal:low=2,high=1", "tide"):
        with pytest.raises(HeddleError):
            parse_profile(bad)
    with pytest.raises(HeddleError, match="peak must be positive"):
        BurstProfile(peak=0)
    assert arrival_spec("burst:peak=2") == "burst:peak=2"
    assert arrival_spec("poisson") == "poisson"
    with pytest.raises(HeddleError, match="unknown arrival process"):
        arrival_spec("weibull")
    with pytest.raises(argparse.ArgumentTypeError):
        arrival_arg("burst:peak=-1")


def test_every_workload_takes_a_profile_and_keeps_its_requests() -> None:
    steady = get_workload("long-prompt-mix", seed=0, num_requests=300, rate=10.0)
    bursty = get_workload(
        "long-prompt-mix", seed=0, num_requests=300, rate=10.0, arrival="burst:start_seconds=5"
    )
    assert [(r.prompt_len, r.output_len, r.request_class) for r in steady] == [
        (r.prompt_len, r.output_len, r.request_class) for r in bursty
    ]
    assert [r.arrival_time for r in steady] != [r.arrival_time for r in bursty]
    assert bursty.params["arrival"] == "burst:start_seconds=5"
    same = get_workload("chat", seed=3, num_requests=50, rate=4.0, arrival="diurnal")
    assert (
        same.requests
        == get_workload("chat", seed=3, num_requests=50, rate=4.0, arrival="diurnal").requests
    )


def test_a_profile_needs_a_finite_rate() -> None:
    with pytest.raises(HeddleError, match="finite positive base rate"):
        arrival_times("burst", float("inf"), 10, random.Random(0))


def test_phase_labels() -> None:
    spec = "burst:start_seconds=10,peak_seconds=5,calm_seconds=20"
    assert [phase_of(spec, t) for t in (0, 9.9, 10, 14.9, 15, 34.9, 35)] == [
        "calm",
        "calm",
        "burst",
        "burst",
        "calm",
        "calm",
        "burst",
    ]
    assert phase_of("poisson", 3.0) == phase_of(None, 3.0) == "sustained"


def test_trace_time_compression_multiplies_the_rate(tmp_path) -> None:
    path = tmp_path / "t.csv"
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    rows += [f"{i * 0.5},{10 + i},{5}" for i in range(41)]
    path.write_text("\n".join(rows) + "\n")
    plain = trace(str(path))
    compressed = trace(str(path), time_scale=1 / 3)
    assert plain[-1].arrival_time == pytest.approx(20.0)
    assert compressed[-1].arrival_time == pytest.approx(20.0 / 3)
    assert [r.prompt_len for r in plain] == [r.prompt_len for r in compressed]


def test_phase_spans_cover_the_run() -> None:
    burst = BurstProfile(peak_seconds=10, calm_seconds=20, start_seconds=5)
    assert burst.spans(50) == {
        "calm": [(0.0, 5.0), (15.0, 35.0), (45.0, 50)],
        "burst": [(5.0, 15.0), (35.0, 45.0)],
    }
    assert DiurnalProfile(period=100).spans(120) == {
        "rising": [(0.0, 50.0), (100.0, 120)],
        "falling": [(50.0, 100.0)],
    }
