"""The pause estimator and the retention policies' decisions (pure, no engine)."""

from __future__ import annotations

import math
import random

import pytest

from heddle.errors import HeddleError
from heddle.sessions.pauses import PauseEstimate, PauseEstimator
from heddle.sessions.retention import (
    CostRetention,
    Costs,
    ParkedView,
    Pressure,
    Retention,
    make_retention,
)


def test_hint_is_the_prior_and_observations_move_it() -> None:
    est = PauseEstimator()
    assert est.estimate("s", "pytest", 5.0).mean == pytest.approx(5.0)
    rng = random.Random(0)
    for _ in range(200):  # the tool really takes ~50 s, 10x the hint
        est.observe(f"s{rng.random()}", "pytest", rng.lognormvariate(math.log(50.0), 0.3))
    learned = est.estimate("s", "pytest", 5.0).mean
    assert 40.0 < learned < 60.0
    # Another tool keeps its own belief.
    assert est.estimate("s", "ls", 0.1).mean == pytest.approx(0.1, rel=0.05)


def test_session_pauses_count_more_than_others() -> None:
    est = PauseEstimator()
    for i in range(10):
        est.observe(f"other{i}", "t", 1.0)
    est.observe("mine", "t", 10.0)
    est.observe("mine", "t", 10.0)
    mine, other = est.estimate("mine", "t", None).mean, est.estimate("new", "t", None).mean
    assert mine > 1.5 * other
    est.forget("mine")
    assert est.estimate("mine", "t", None).mean == pytest.approx(other)


def test_remaining_pause_grows_with_elapsed_for_heavy_tails() -> None:
    heavy = PauseEstimate(math.log(1.0), 1.5)
    assert heavy.remaining(0.0) == pytest.approx(heavy.mean)
    values = [heavy.remaining(t) for t in (0.5, 2.0, 10.0, 60.0)]
    assert values == sorted(values) and values[-1] > 10 * heavy.mean
    light = PauseEstimate(math.log(1.0), 0.1)
    assert light.remaining(0.5) == pytest.approx(0.5, abs=0.1)
    assert light.remaining(1e6) > 0  # far out in the tail: still finite and positive


COSTS = Costs(recompute_seconds=lambda n: n * 1e-4, copy_seconds=lambda b: b * 1e-5)


def _view(blocks: int = 100, tokens: int = 1600, remaining: float = 1.0) -> ParkedView:
    return ParkedView("s", blocks, tokens, 0.0, remaining)


def test_cost_keeps_without_pressure_and_weighs_pause_against_recompute() -> None:
    policy = CostRetention()
    calm = Pressure(num_free_blocks=1000, num_blocks_wanted=10, num_waiting=1)
    assert policy.on_park(_view(remaining=1e6), calm, COSTS) is Retention.KEEP
    # 300 blocks run; a shortage of 50 blocks. Keeping wastes remaining x 50 block-seconds;
    # dropping recomputes 1600 tokens (0.16 s) while 300 + 100 blocks wait: 64 block-seconds.
    tight = Pressure(0, 50, 1, num_running_blocks=300)
    no_tier = Costs(recompute_seconds=COSTS.recompute_seconds)
    assert policy.keep_cost(_view(remaining=1.0), tight) == pytest.approx(50.0)
    assert policy.drop_cost(_view(), tight, no_tier) == pytest.approx(64.0)
    assert policy.on_park(_view(remaining=1.2), tight, no_tier) is Retention.KEEP
    assert policy.on_park(_view(remaining=1.4), tight, no_tier) is Retention.DROP
    # With a second tier that has room, a copy (1 ms) beats recompute.
    roomy = Pressure(0, 50, 1, num_host_free_blocks=1000, num_running_blocks=300)
    assert policy.on_park(_view(remaining=1.4), roomy, COSTS) is Retention.OFFLOAD
    full = Pressure(0, 50, 1, num_host_free_blocks=10, num_running_blocks=300)
    assert policy.on_park(_view(remaining=1.4), full, COSTS) is Retention.DROP


def test_reclaim_order_follows_waste_not_age() -> None:
    policy = CostRetention()
    pressure = Pressure(num_free_blocks=0, num_blocks_wanted=50, num_waiting=2)
    no_tier = Costs(recompute_seconds=COSTS.recompute_seconds)
    old_short = ParkedView("old", 50, 800, 0.0, 0.01)  # parked first, back in 10 ms
    young_long = ParkedView("young", 50, 800, 5.0, 30.0)  # parked last, gone for 30 s
    order = policy.reclaim_order([old_short, young_long], pressure, no_tier, must=False)
    assert [v.session_id for v, _ in order] == ["young"]  # keeping "old" is cheaper
    forced = policy.reclaim_order([old_short, young_long], pressure, no_tier, must=True)
    assert [v.session_id for v, _ in forced] == ["young", "old"]
    assert all(choice is Retention.DROP for _, choice in forced)


def test_named_policies() -> None:
    assert make_retention("lru").on_park(_view(), Pressure(10, 0, 0), COSTS) is Retention.DROP
    assert not make_retention("lru").parks
    ttl = make_retention("ttl", ttl=3.0)
    assert ttl.on_park(_view(), Pressure(0, 10**6, 99), COSTS) is Retention.KEEP
    assert not ttl.pin_expired(_view(), 2.9) and ttl.pin_expired(_view(), 3.0)
    # A pin holds against waiting requests; a running one that would be preempted takes the
    # oldest pins first.
    young, old = ParkedView("young", 10, 160, 5.0, 1.0), ParkedView("old", 10, 160, 1.0, 1.0)
    assert ttl.reclaim_order([young, old], Pressure(0, 10**6, 99), COSTS, must=False) == []
    forced = ttl.reclaim_order([young, old], Pressure(0, 10**6, 99), COSTS, must=True)
    assert [v.session_id for v, _ in forced] == ["old", "young"]
    with pytest.raises(HeddleError, match="unknown retention"):
        make_retention("forever")
    with pytest.raises(HeddleError, match="bad options"):
        make_retention("ttl", seconds=1)
    with pytest.raises(HeddleError, match="positive"):
        make_retention("ttl", ttl=0)
