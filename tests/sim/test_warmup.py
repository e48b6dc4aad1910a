"""The idle warm-up: its curve, its fit, the profile's JSON and the simulator charging it."""

from __future__ import annotations

import json

import pytest

from heddle.clock import VirtualClock
from heddle.errors import HeddleError
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.profiled import FEATURES, ProfiledCostModel
from heddle.sim.warmup import IdleWarmup, fit_warmup
from tests.sim.factories import scheduled, step

WARMUP = IdleWarmup((0.001, 0.01, 0.1, 1.0), (0.0005, 0.002, 0.004, 0.008))


def test_curve_is_zero_back_to_back_log_linear_between_points_and_flat_after():
    assert WARMUP.time(0.0) == 0.0 and WARMUP.time(0.0001) == 0.0
    assert WARMUP.time(0.01) == pytest.approx(0.002)
    # Half way between 10 ms and 100 ms in log scale.
    assert WARMUP.time(0.01 * 10**0.5) == pytest.approx(0.003)
    assert WARMUP.time(5.0) == WARMUP.time(None) == 0.008  # the first step: the longest gap
    assert 0.0 < WARMUP.time(0.0007) < 0.0005


@pytest.mark.parametrize(
    ("gaps", "extra", "match"),
    [
        ((), (), "at least one gap"),
        ((0.01, 0.001), (0.0, 0.0), "must increase"),
        ((0.0001,), (0.0,), "must exceed"),
        ((0.01,), (-1.0,), ">= 0"),
    ],
)
def test_bad_curves_are_clear_errors(gaps, extra, match):
    with pytest.raises(HeddleError, match=match):
        IdleWarmup(gaps, extra)


def test_fit_takes_the_median_per_nearest_gap_and_fills_empty_bins():
    points = [(0.0011, 0.001), (0.0009, 0.003), (0.001, 0.002),  # 1 ms: median 2 ms
              (0.12, 0.004), (0.09, 0.006),  # 100 ms: median 5 ms; 10 ms has none
              (0.00005, 9.0)]  # back to back: ignored  # fmt: skip
    fitted = fit_warmup(points, (0.001, 0.01, 0.1))
    assert fitted.extra == pytest.approx((0.002, 0.002, 0.005))
    noise = fit_warmup([(0.01, -0.001), (0.01, -0.002)], (0.01,))
    assert noise.extra == (0.0,)  # faster after idle than back to back: no warm-up
    with pytest.raises(HeddleError, match="no step followed an idle gap"):
        fit_warmup([(0.0, 0.01)], (0.01,))


def _model(warmup: IdleWarmup | None) -> ProfiledCostModel:
    return ProfiledCostModel({name: 0.0 for name in FEATURES} | {"constant": 0.01}, None, warmup)


def test_profile_keeps_its_warmup_through_json(tmp_path):
    path = tmp_path / "p.json"
    _model(WARMUP).save(path)
    loaded = ProfiledCostModel.load(path)
    assert loaded.warmup == WARMUP and loaded.charges_idle
    assert loaded.idle_time(0.01) == pytest.approx(0.002)
    _model(None).save(path)
    assert ProfiledCostModel.load(path).warmup is None
    data = json.loads(path.read_text()) | {"idle_warmup": {"gaps": [0.01]}}
    path.write_text(json.dumps(data))
    with pytest.raises(HeddleError, match="malformed idle warm-up"):
        ProfiledCostModel.load(path)


def test_simulated_executor_charges_the_warmup_after_a_wait_on_the_clock():
    clock = VirtualClock()
    executor = SimulatedExecutor(_model(WARMUP), clock, vocab_size=100)
    first = executor.execute(step(scheduled("a", 8, 0)))
    assert first.step_duration == pytest.approx(0.01 + 0.008)  # the first step: cold
    back_to_back = executor.execute(step(scheduled("a", 1, 8)))
    assert back_to_back.step_duration == pytest.approx(0.01)
    clock.wait_until(clock.now() + 0.1)  # idle 100 ms
    after_idle = executor.execute(step(scheduled("a", 1, 9)))
    assert after_idle.step_duration == pytest.approx(0.01 + 0.004)
    assert clock.now() == pytest.approx(0.018 + 0.01 + 0.1 + 0.014)
    assert executor.execute(step()).step_duration == 0.0  # nothing ran: no warm-up either
    shape_only = SimulatedExecutor(_model(WARMUP).with_warmup(None), VirtualClock(), 100)
    assert shape_only.execute(step(scheduled("a", 8, 0))).step_duration == pytest.approx(0.01)
