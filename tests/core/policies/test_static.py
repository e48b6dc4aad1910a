from __future__ import annotations

from tests.factories import create_request, create_scheduler, sample_all


def run_steps(sched, num_steps):
    trace = []
    for _ in range(num_steps):
        out = sched.schedule()
        trace.append(out.scheduled_tokens())
        sched.update(out, sample_all(out))
    return trace


def test_no_admission_while_a_batch_member_runs():
    sched = create_scheduler(policy="static", max_num_batched_tokens=100)
    sched.add_request(create_request("a", prompt_len=8, max_tokens=1))
    sched.add_request(create_request("b", prompt_len=8, max_tokens=3, first_token=200))
    trace = run_steps(sched, 1)
    sched.add_request(create_request("c", prompt_len=8, max_tokens=1, first_token=300))
    trace += run_steps(sched, 3)
    # a finished at once, but c waits until b, the batch's last member, has finished.
    assert trace == [{"a": 8, "b": 8}, {"b": 1}, {"b": 1}, {"c": 8}]
    assert not sched.has_unfinished_requests()


def test_fcfs_admits_a_newcomer_at_once():
    sched = create_scheduler(policy="fcfs", max_num_batched_tokens=100)
    sched.add_request(create_request("a", prompt_len=8, max_tokens=1))
    sched.add_request(create_request("b", prompt_len=8, max_tokens=3, first_token=200))
    trace = run_steps(sched, 1)
    sched.add_request(create_request("c", prompt_len=8, max_tokens=1, first_token=300))
    trace += run_steps(sched, 1)
    assert trace == [{"a": 8, "b": 8}, {"b": 1, "c": 8}]


def test_a_chunked_member_keeps_the_batch_closed():
    sched = create_scheduler(policy="static", max_num_batched_tokens=10, max_num_seqs=4)
    sched.add_request(create_request("a", prompt_len=4, max_tokens=1))
    sched.add_request(create_request("b", prompt_len=12, max_tokens=1, first_token=200))
    sched.add_request(create_request("c", prompt_len=4, max_tokens=1, first_token=300))
    # The budget admits a and a chunk of b; c did not get in, so it waits for the next batch
    # even when the budget would have room for it.
    trace = run_steps(sched, 3)
    assert trace == [{"a": 4, "b": 6}, {"b": 6}, {"c": 4}]
    assert sched.policy.batch == frozenset()
