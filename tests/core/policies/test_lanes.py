from __future__ import annotations

import pytest

from heddle.core.policies import SchedulerView, make_policy
from tests.factories import create_request, create_scheduler, sample_all


def big_scheduler(policy):
    return create_scheduler(
        policy=policy, num_blocks=300, block_size=16, max_num_batched_tokens=512
    )


def step(sched):
    out = sched.schedule()
    sched.update(out, sample_all(out))
    return out.scheduled_tokens()


@pytest.mark.parametrize(
    ("policy", "expected"), [("lanes", {"short": 20, "long": 128}), ("fcfs", {"long": 512})]
)
def test_short_prompt_arriving_with_a_long_one_gets_its_first_token_at_once(policy, expected):
    sched = big_scheduler(policy)
    sched.add_request(create_request("long", prompt_len=4000, max_tokens=4))
    short = create_request("short", prompt_len=20, max_tokens=4, first_token=5000)
    sched.add_request(short)
    assert step(sched) == expected
    assert (short.num_output_tokens == 1) == (policy == "lanes")


def test_short_prompt_arriving_one_step_later_waits_at_most_one_step():
    sched = big_scheduler("lanes")
    sched.add_request(create_request("long", prompt_len=4000, max_tokens=4))
    assert step(sched) == {"long": 512}  # no short demand: the long lane takes all
    short = create_request("short", prompt_len=20, max_tokens=4, first_token=5000)
    sched.add_request(short)
    assert step(sched) == {"long": 128, "short": 20}  # long is capped at its 25% share
    assert short.num_output_tokens == 1
    assert step(sched) == {"short": 1, "long": 128}  # short first from now on
    short_decodes_left = [step(sched) for _ in range(2)]
    assert short_decodes_left == [{"short": 1, "long": 128}] * 2
    assert short.is_finished and step(sched) == {"long": 512}


def lane_budgets(short_demand, long_demand, **options):
    """Lane budgets of a 400-token step with a short prompt waiting and a long one running."""
    policy = make_policy("lanes", long_prompt_tokens=500, **options)
    waiting, running = [], []
    if short_demand:
        waiting.append(create_request("s", prompt_len=short_demand))
    if long_demand:
        long = create_request("l", prompt_len=2000, first_token=1000)
        long.num_computed_tokens = 2000 - long_demand
        running.append(long)
    view = SchedulerView(0.0, running, waiting, 400, 8, 1000, 1000, 16)
    limits = policy.step_limits(view)
    assert limits.token_budget == 400
    return limits.lane_budgets


def test_lane_budgets_follow_demand():
    # Short needs little: long takes the rest up to its 25% cap, which keeps steps short.
    assert lane_budgets(20, 1000) == {"short": 300, "long": 100}
    assert lane_budgets(300, 1000) == {"short": 300, "long": 100}
    # Short needs more: long is squeezed, down to its guaranteed 5% (20 tokens).
    assert lane_budgets(330, 1000) == {"short": 330, "long": 70}
    assert lane_budgets(390, 1000) == {"short": 380, "long": 20}
    assert lane_budgets(390, 1000, long_min_share=0.1) == {"short": 360, "long": 40}
    # No short work: long may take everything.
    assert lane_budgets(0, 1000) == {"short": 0, "long": 400}
    # Long needs little or nothing: short takes what long leaves.
    assert lane_budgets(390, 10) == {"short": 390, "long": 20}
    assert lane_budgets(99, 0) == {"short": 400, "long": 100}


def test_long_generations_move_to_the_long_lane():
    policy = make_policy("lanes", long_prompt_tokens=100, long_output_tokens=3)
    request = create_request("r", prompt_len=10, max_tokens=10)
    lanes = []
    for _ in range(4):
        lanes.append(policy.lane_of(request))
        request.append_output_token(7)
    assert lanes == ["short", "short", "short", "long"]
    assert policy.lane_of(create_request("p", prompt_len=100)) == "long"


def test_short_requests_without_a_seat_do_not_hold_the_long_lane_back():
    policy = make_policy("lanes", long_prompt_tokens=500)
    long = create_request("l", prompt_len=2000)
    waiting = [create_request("s", prompt_len=50, first_token=3000)]
    seats_full = SchedulerView(0.0, [long], waiting, 400, 1, 1000, 1000, 16)
    assert policy.step_limits(seats_full).lane_budgets == {"short": 0, "long": 400}
    seat_free = SchedulerView(0.0, [long], waiting, 400, 2, 1000, 1000, 16)
    assert policy.step_limits(seat_free).lane_budgets == {"short": 300, "long": 100}
