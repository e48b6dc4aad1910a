from __future__ import annotations

import pytest

from heddle.core.policies import make_policy
from heddle.errors import HeddleError
from tests.factories import create_request, create_scheduler


def test_shortest_true_remaining_work_first():
    policy = make_policy("oracle", prompt_weight=0.0)
    assert policy.needs_true_output_len
    waiting = [
        create_request("a", max_tokens=100, true_output_len=50),
        create_request("b", max_tokens=100, true_output_len=3),
        create_request("c", max_tokens=2, true_output_len=50),  # stops at max_tokens=2
    ]
    assert [r.request_id for r in policy.order_waiting(waiting, now=0.0)] == ["c", "b", "a"]


def test_requests_without_true_length_are_a_clear_error_at_first_use():
    sched = create_scheduler(policy="oracle")  # constructing is fine
    with pytest.raises(HeddleError, match="true output length"):
        sched.add_request(create_request("a"))  # ranked when queued: refused, nothing kept
    assert not sched.has_unfinished_requests() and not sched.waiting
    sched.check_integrity()
