from __future__ import annotations

from heddle.core.policies import SchedulerView, make_policy
from tests.core.policies.harness import Arrival, make_engine, run
from tests.factories import create_request, create_scheduler, sample_all


def view(running=(), waiting=()):
    return SchedulerView(0.0, list(running), list(waiting), 32, 8, 64, 64, 4)


def ids(requests):
    return [r.request_id for r in requests]


def test_counters_charge_prompt_and_output_tokens_by_weight():
    sched = create_scheduler(policy="fair", max_num_batched_tokens=100, output_weight=3)
    sched.add_request(create_request("a", prompt_len=8, max_tokens=5, user="ann"))
    sched.add_request(create_request("b", prompt_len=4, max_tokens=5, user="bob", first_token=200))
    for _ in range(3):
        out = sched.schedule()
        sched.update(out, sample_all(out))
    # ann: 8 prompt tokens + 3 tokens generated * 3; bob: 4 + 3 * 3.
    assert sched.policy.counters == {"ann": 17.0, "bob": 13.0}


def test_a_prefill_chunk_that_does_not_sample_is_charged_input_weight_only():
    sched = create_scheduler(policy="fair", max_num_batched_tokens=6, output_weight=3)
    sched.add_request(create_request("a", prompt_len=10, max_tokens=5, user="ann"))
    out = sched.schedule()  # 6 of the 10 prompt tokens: nothing is sampled
    assert out.sample == [False]
    sched.update(out, sample_all(out))
    assert sched.policy.counters == {"ann": 6.0}
    out = sched.schedule()  # the last 4 prompt tokens, and the first output token
    sched.update(out, sample_all(out))
    assert sched.policy.counters == {"ann": 13.0}


def test_the_user_with_least_service_goes_first():
    policy = make_policy("fair")
    policy.counters.update({"ann": 100.0, "bob": 50.0})
    waiting = [
        create_request("a1", arrival_time=0.0, user="ann"),
        create_request("b1", arrival_time=1.0, user="bob"),
    ]
    policy.step_limits(view(waiting=waiting))
    assert ids(policy.order_waiting(waiting, now=1.0)) == ["b1", "a1"]


def test_users_interleave_within_one_step():
    policy = make_policy("fair")  # each 8-token request costs 8 + 2 = 10
    waiting = [create_request(f"a{i}", arrival_time=0.0, user="ann") for i in range(3)]
    waiting += [create_request(f"b{i}", arrival_time=1.0, user="bob") for i in range(2)]
    policy.step_limits(view(waiting=waiting))
    assert ids(policy.order_waiting(waiting, now=1.0)) == ["a0", "b0", "a1", "b1", "a2"]


def test_a_returning_user_is_lifted_to_the_least_active_counter_without_banked_credit():
    policy = make_policy("fair")
    policy.counters.update({"ann": 100.0, "bob": 50.0, "cy": 10.0})
    ann, bob = create_request("a", user="ann"), create_request("b", user="bob")
    policy.step_limits(view(running=[ann, bob]))
    cy = create_request("c", user="cy")
    policy.step_limits(view(running=[ann, bob], waiting=[cy]))
    assert policy.counters["cy"] == 50.0  # lifted from 10 to bob's 50
    # Everyone leaves; a newcomer starts at the counter of those who left last.
    policy.step_limits(view())
    policy.step_limits(view(waiting=[create_request("d", user="dee")]))
    assert policy.counters["dee"] == 100.0


def service_gap(policy):
    """Largest |weighted service of ann - of bob| while both still have requests queued."""
    engine, executor, clock = make_engine(
        policy, num_blocks=64, max_num_batched_tokens=32, max_num_seqs=4
    )
    arrivals = [Arrival(f"ann{i:02d}", 0.0, 24, 8, fields={"user": "ann"}) for i in range(30)]
    arrivals += [Arrival(f"bob{i:02d}", 0.0, 4, 8, fields={"user": "bob"}) for i in range(30)]
    run(engine, clock, arrivals)
    first_step: dict[str, int] = {}
    service = {"ann": 0.0, "bob": 0.0}
    gaps = []
    for step, out in enumerate(executor.outputs):
        for s in out.rows():
            first_step.setdefault(s.request_id, step)
            num_prompt = 24 if s.request_id.startswith("ann") else 4
            prompt = max(0, min(s.context_len, num_prompt) - s.num_computed_tokens)
            service[s.request_id[:3]] += prompt + 2.0 * s.sample
        gaps.append(abs(service["ann"] - service["bob"]))
    # Both are backlogged until the first step in which one of them has nothing left queued.
    backlogged_until = min(first_step["ann29"], first_step["bob29"])
    return max(gaps[:backlogged_until])


def test_service_gap_between_backlogged_users_stays_within_the_vtc_bound():
    # VTC bound: 2 * max(weighted tokens of one step, weighted tokens of one request).
    bound = 2 * max(32, 24 + 2 * 8)
    assert service_gap("fair") <= bound
    assert service_gap("fcfs") > 5 * bound  # ann's burst came first: bob waits behind it


def test_counters_of_many_one_time_users_are_forgotten_without_changing_the_order():
    policy = make_policy("fair")
    policy.counters["heavy"] = 1e9  # idle, above any floor: must be remembered
    for i in range(200):  # one-time users, each served once and gone
        policy.step_limits(view(waiting=[create_request(f"r{i}", user=f"u{i}")]))
        policy.counters[f"u{i}"] += 10.0
    policy.step_limits(view(waiting=[create_request("x", user="steady")]))
    assert len(policy.counters) < 40
    assert policy.counters["heavy"] == 1e9
    back = [create_request("h", arrival_time=0.0, user="heavy"), create_request("s", user="steady")]
    policy.step_limits(view(waiting=back))
    assert ids(policy.order_waiting(back, now=0.0)) == ["s", "h"]
