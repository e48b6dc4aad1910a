from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.core.policies.step_time import StepTimeModel
from tests.factories import create_request, create_scheduler, sample_all


def ids(requests):
    return [r.request_id for r in requests]


def test_waiting_requests_are_ordered_by_first_token_deadline():
    policy = make_policy("slo", ttft={"chat": 0.5}, default_ttft=2.0)
    requests = [
        create_request("own", arrival_time=0.0, ttft_slo=1.0),  # due 1.0
        create_request("tight", arrival_time=0.2, ttft_slo=0.3),  # due 0.5
        create_request("chat", arrival_time=0.1, request_class="chat"),  # due 0.6
        create_request("default", arrival_time=0.0),  # due 2.0
    ]
    assert ids(policy.order_waiting(requests, now=0.3)) == ["tight", "chat", "own", "default"]


def test_running_requests_are_due_one_tpot_after_their_last_token():
    policy = make_policy("slo", default_ttft=1.0, tpot={"batch": 0.5}, default_tpot=0.1)
    decoding = create_request("decoding", arrival_time=0.0)
    decoding.record.token_times.append(1.05)  # next token due 1.15
    relaxed = create_request("relaxed", arrival_time=0.0, request_class="batch")
    relaxed.record.token_times.append(0.5)  # due 1.0
    fresh = create_request("fresh", arrival_time=0.1)  # first token due 1.1
    assert ids(policy.order_running([decoding, relaxed, fresh], now=1.06)) == [
        "relaxed",
        "fresh",
        "decoding",
    ]


def test_hopeless_first_tokens_go_back_but_still_run():
    policy = make_policy("slo", late_factor=1.0, late_shift=30.0)
    hopeless = create_request("hopeless", arrival_time=0.0, ttft_slo=0.3)  # due 0.3
    fresh = create_request("fresh", arrival_time=5.0, ttft_slo=0.5)  # due 5.5
    # At 5 s the first is overdue by 4.7 s > 0.3 s: its deadline moves to 0.3 + 30 * 0.3 = 9.3.
    assert policy.deadline(hopeless, now=5.0) == pytest.approx(9.3)
    assert ids(policy.order_waiting([hopeless, fresh], now=5.0)) == ["fresh", "hopeless"]
    later = create_request("later", arrival_time=19.0, ttft_slo=0.5)
    assert ids(policy.order_waiting([hopeless, later], now=19.0)) == ["hopeless", "later"]


def test_step_time_model_learns_base_and_per_token_cost():
    model = StepTimeModel(alpha=0.2)
    for tokens in [10, 30, 50, 20, 40, 5]:
        model.observe(tokens, 0.01 + 0.001 * tokens)
    base, per_token = model.coefficients()
    assert base == pytest.approx(0.01) and per_token == pytest.approx(0.001)
    assert model.max_tokens_within(0.05) == 40
    constant = StepTimeModel()
    constant.observe(20, 0.03)  # one size only: assumed proportional, the cautious side
    assert constant.coefficients() == (0.0, pytest.approx(0.0015))


def trained_scheduler(**options):
    sched = create_scheduler(policy="slo", max_num_batched_tokens=64, headroom=1.0, **options)
    sched.policy.step_model.observe(10, 0.02)  # seconds = 0.01 + 0.001 * tokens
    sched.policy.step_model.observe(50, 0.06)
    return sched


def scheduled(out):
    return {s.request_id: len(s.token_ids) for s in out.scheduled}


@pytest.mark.parametrize(
    ("b_tpot", "expected"),
    [
        (None, {"a": 1, "b": 1, "c": 38}),  # (0.05 - 0.01) / 0.001 = 40 tokens in the step
        (0.03, {"a": 1, "b": 1, "c": 18}),  # the tightest running target sets the cap
        (0.5, {"a": 1, "b": 1, "c": 38}),
    ],
)
def test_token_budget_is_capped_to_hold_running_tpot(b_tpot, expected):
    sched = trained_scheduler(default_tpot=0.05)
    sched.add_request(create_request("a", prompt_len=8, max_tokens=50))
    sched.add_request(
        create_request("b", prompt_len=8, max_tokens=50, tpot_slo=b_tpot, first_token=200)
    )
    out = sched.schedule()
    assert scheduled(out) == {"a": 8, "b": 8}  # nobody decodes yet: no cap
    sched.update(out, sample_all(out, duration=0.026))
    sched.add_request(create_request("c", prompt_len=60, max_tokens=50, first_token=300))
    out = sched.schedule()
    assert scheduled(out) == expected
    assert sched.policy.last_cap == sum(expected.values())


def test_no_cap_when_a_loose_target_or_an_infeasible_one():
    for tpot in (0.2, 0.005):  # 190 tokens fit in 0.2 s; 0.005 s is below the step's base
        sched = trained_scheduler(default_tpot=tpot)
        sched.add_request(create_request("a", prompt_len=8, max_tokens=50))
        out = sched.schedule()
        sched.update(out, sample_all(out, duration=0.018))
        sched.add_request(create_request("c", prompt_len=60, max_tokens=50, first_token=300))
        assert scheduled(sched.schedule()) == {"a": 1, "c": 60}
        assert sched.policy.last_cap is None


def test_step_time_is_learned_from_the_steps_that_ran():
    sched = create_scheduler(policy="slo", max_num_batched_tokens=64, default_tpot=1.0)
    for i, prompt_len in enumerate([30, 5, 50, 12]):
        sched.add_request(create_request(f"r{i}", prompt_len, max_tokens=50, first_token=100 * i))
        out = sched.schedule()
        sched.update(out, sample_all(out, duration=0.01 + 0.001 * out.num_scheduled_tokens))
    base, per_token = sched.policy.step_model.coefficients()
    assert base == pytest.approx(0.01) and per_token == pytest.approx(0.001)
