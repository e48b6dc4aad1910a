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
    decoding.first_token_time = 1.05  # one token out: the next is due 1.15
    decoding.append_output_token(7)
    relaxed = create_request("relaxed", arrival_time=0.0, request_class="batch")
    relaxed.first_token_time = 0.5  # due 1.0
    relaxed.append_output_token(7)
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
    return out.scheduled_tokens()


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


def seated(sched, request_id, first_token_time):
    """Admit `request_id` alone and give it its first token at `first_token_time`."""
    out = sched.schedule()
    assert scheduled(out) == {request_id: 8}
    sched.clock.advance(first_token_time - sched.clock.now())
    sched.update(out, sample_all(out))


@pytest.mark.parametrize(("first_token_time", "evicted"), [(0.2, False), (0.8, True)])
def test_a_fresh_request_takes_the_seat_of_a_lost_one_only(first_token_time, evicted):
    sched = create_scheduler(policy="slo", max_num_seqs=1, default_ttft=0.5)
    sched.add_request(create_request("old", max_tokens=50))
    seated(sched, "old", first_token_time)  # TTFT 0.2 s: on time; 0.8 s: lost
    sched.add_request(create_request("new", arrival_time=first_token_time, first_token=300))
    out = sched.schedule()
    if evicted:
        assert out.preempted_request_ids == ["old"]
        assert scheduled(out) == {"new": 8}
    else:
        assert not out.preempted_request_ids and scheduled(out) == {"old": 1}


def test_lost_requests_are_evicted_at_most_max_preemptions_times():
    sched = create_scheduler(policy="slo", max_num_seqs=1, default_ttft=0.5, max_preemptions=1)
    sched.add_request(create_request("old", max_tokens=50))
    seated(sched, "old", 0.8)
    sched.add_request(create_request("a", arrival_time=0.8, max_tokens=1, first_token=300))
    out = sched.schedule()
    assert out.preempted_request_ids == ["old"]
    sched.update(out, sample_all(out))  # "a" finishes with its one token
    # "old" (lost, deadline moved back) is seated again once the seat is free ...
    out = sched.schedule()
    assert scheduled(out) == {"old": 1}  # its 8 prompt tokens are in the prefix cache
    assert sched.running[0].record.num_preemptions == 1
    sched.update(out, sample_all(out))
    # ... and a second fresh arrival may not evict it again.
    sched.add_request(create_request("b", arrival_time=0.8, first_token=400))
    out = sched.schedule()
    assert not out.preempted_request_ids and scheduled(out) == {"old": 1}


def test_a_lost_decode_does_not_cap_the_step():
    sched = trained_scheduler(default_tpot=0.05, default_ttft=0.5)
    sched.add_request(create_request("late", prompt_len=8, max_tokens=50))
    out = sched.schedule()
    sched.clock.advance(0.8)  # its first token comes 0.8 s after arrival: lost
    sched.update(out, sample_all(out))
    sched.add_request(create_request("c", prompt_len=60, arrival_time=0.8, first_token=300))
    out = sched.schedule()
    assert sched.policy.last_cap is None
    assert scheduled(out) == {"c": 60, "late": 1}


@pytest.mark.parametrize(("decode_steps", "evicted"), [(1, False), (10, True)])
def test_an_on_time_decode_yields_its_seat_only_with_banked_slack(decode_steps, evicted):
    # TPOT target 0.2 s, steps of 0.01 s: every token banks 0.19 s of slack. A newcomer may take
    # the seat once the slack covers waiting a whole TTFT target (0.5 s) again plus recompute.
    sched = create_scheduler(policy="slo", max_num_seqs=1, default_ttft=0.5, default_tpot=0.2)
    sched.add_request(create_request("old", max_tokens=50))
    seated(sched, "old", 0.1)  # on time
    for _ in range(decode_steps - 1):
        out = sched.schedule()
        sched.clock.advance(0.01)
        sched.update(out, sample_all(out))
    now = sched.clock.now()
    sched.add_request(create_request("new", arrival_time=now, first_token=300))
    out = sched.schedule()
    assert out.preempted_request_ids == (["old"] if evicted else [])
    assert scheduled(out) == ({"new": 8} if evicted else {"old": 1})
