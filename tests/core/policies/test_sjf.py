from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.core.policies.predictor import OutputLenPredictor
from heddle.request import FinishReason
from tests.core.policies.harness import Arrival, make_engine, run
from tests.factories import create_request


def finished(request_id, output_len, **kwargs):
    request = create_request(request_id, max_tokens=1000, **kwargs)
    for _ in range(output_len):
        request.append_output_token(7)
    request.finish_reason = FinishReason.STOP
    return request


def ids(requests):
    return [r.request_id for r in requests]


def test_predictor_learns_per_class_and_its_error_shrinks():
    predictor = OutputLenPredictor(default_output_len=128, min_samples=2, window=10)
    for i in range(20):
        for cls, length in (("short", 5), ("long", 50)):
            request = finished(f"{cls}{i}", length, request_class=cls)
            predictor.predict(request)  # as when the request arrived and was first ordered
            predictor.observe(request)
    assert predictor.predict(create_request("s", request_class="short")) == pytest.approx(5)
    assert predictor.predict(create_request("l", request_class="long")) == pytest.approx(50)
    stats = predictor.stats()
    assert stats.num_samples == 40
    # short0: the default (123 off); long0: the global mean of one sample, 5 (45 off); short1
    # and long1: global means 27.5 and 20 (22.5 and 30 off); then each class's own mean, exact.
    assert stats.mean_abs_error == pytest.approx((123 + 45 + 22.5 + 30) / 40)
    assert stats.recent_abs_error == 0.0 and stats.recent_rel_error == 0.0


def test_predictor_falls_back_from_user_and_bucket_to_class_to_global():
    predictor = OutputLenPredictor(default_output_len=100, min_samples=1)
    predictor.observe(finished("a", 10, request_class="chat", user="ann"))
    predictor.observe(finished("b", 30, request_class="chat", user="bob", prompt_len=100))
    # ann with an 8-token prompt: her own entry.
    assert predictor.predict(create_request("x", request_class="chat", user="ann")) == 10
    # cy with a 100-token prompt: the (class, bucket) entry bob filled.
    assert predictor.predict(create_request("y", 100, request_class="chat", user="cy")) == 30
    # cy with a 1000-token prompt: the class mean; another class: the global mean.
    assert predictor.predict(create_request("z", 1000, request_class="chat", user="cy")) == 20
    assert predictor.predict(create_request("w", request_class="code")) == 20
    assert predictor.predict(create_request("h", output_len_hint=3)) == 3


def test_aborted_requests_teach_nothing():
    predictor = OutputLenPredictor(default_output_len=100, min_samples=1)
    request = finished("a", 10)
    request.finish_reason = FinishReason.ABORT
    predictor.observe(request)
    assert predictor.stats().num_samples == 0
    assert predictor.predict(create_request("b")) == 100


def test_after_learning_short_class_requests_go_first():
    policy = make_policy("sjf", default_output_len=50, min_samples=2)
    waiting = [
        create_request("long", max_tokens=1000, arrival_time=0.0, request_class="essay"),
        create_request("short", max_tokens=1000, arrival_time=0.001, request_class="chat"),
    ]
    assert ids(policy.order_waiting(waiting, now=0.0)) == ["long", "short"]  # nothing known yet
    for i in range(3):
        policy.on_finished(finished(f"e{i}", 200, request_class="essay"))
        policy.on_finished(finished(f"c{i}", 4, request_class="chat"))
    assert ids(policy.order_waiting(waiting, now=0.0)) == ["short", "long"]
    assert policy.predictor.stats().num_samples == 6


def test_remaining_work_counts_prompt_left_and_output_generated():
    policy = make_policy("sjf", default_output_len=20, prompt_weight=0.5)
    request = create_request("r", prompt_len=40, max_tokens=100)
    assert policy.remaining_work(request) == 20 + 0.5 * 40
    request.num_computed_tokens = 40
    for _ in range(5):
        request.append_output_token(7)
    assert policy.remaining_work(request) == 15
    capped = create_request("capped", prompt_len=40, max_tokens=3)  # max_tokens bounds output
    assert policy.remaining_work(capped) == 3 + 20


def test_aging_puts_an_old_long_job_ahead_of_new_short_ones():
    policy = make_policy("sjf", aging_seconds=0.01, prompt_weight=0.0)
    old_long = create_request("old", max_tokens=1000, arrival_time=0.0, output_len_hint=100)
    soon = create_request("soon", max_tokens=1000, arrival_time=0.5, output_len_hint=5)
    late = create_request("late", max_tokens=1000, arrival_time=1.0, output_len_hint=5)
    # Keys: 100 + 0 / 0.01 = 100; 5 + 50 = 55; 5 + 100 = 105.
    assert ids(policy.order_waiting([old_long, soon, late], now=1.0)) == ["soon", "old", "late"]


def test_predictor_improves_while_serving():
    engine, _, clock = make_engine("sjf", max_num_seqs=2, default_output_len=64)
    arrivals = []
    for i in range(40):
        cls, length = ("chat", 3) if i % 2 else ("essay", 24)
        arrivals.append(Arrival(f"r{i}", 0.05 * i, 8, length, fields={"request_class": cls}))
    predictor = engine.scheduler.policy.predictor
    run(engine, clock, arrivals[:20])
    early = predictor.stats()
    run(engine, clock, arrivals[20:])
    late = predictor.stats()
    assert (early.num_samples, late.num_samples) == (20, 40)
    late_error = (late.mean_abs_error * 40 - early.mean_abs_error * 20) / 20
    assert early.mean_abs_error > 5 and late_error == pytest.approx(0.0, abs=1e-9)
