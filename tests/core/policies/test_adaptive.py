from __future__ import annotations

from tests.factories import create_request, create_scheduler, sample_all


def test_batch_cap_shrinks_when_steps_are_slow_and_grows_when_fast():
    sched = create_scheduler(
        policy="adaptive",
        max_num_batched_tokens=64,
        max_num_seqs=8,
        target_tpot=0.05,
        decrease_factor=0.5,
        min_token_budget=4,
        increase_seqs=1,
        increase_tokens=32,
    )
    policy = sched.policy
    for i in range(4):
        sched.add_request(create_request(f"r{i}", prompt_len=8, max_tokens=50, first_token=100 * i))
    trace = []

    def step(duration):
        out = sched.schedule()
        sched.update(out, sample_all(out, duration=duration))
        trace.append(
            (sorted(out.request_ids), policy.max_num_seqs, policy.token_budget)
        )

    step(0.1)  # a slow prefill of 32 tokens: only the token budget is cut, to 16
    step(0.1)  # slow decodes of 4 seats: seats cut to 2, the token budget to its floor of 4
    for i in range(4, 6):
        sched.add_request(create_request(f"r{i}", prompt_len=8, max_tokens=50, first_token=100 * i))
    step(0.01)  # 4 seated, 2 allowed: all still decode; no one is admitted
    step(0.01)
    step(0.01)
    step(0.01)  # 5 seats allowed: r4 comes in
    seated = ["r0", "r1", "r2", "r3"]
    assert trace == [
        (seated, 8, 16),
        (seated, 2, 4),
        (seated, 3, 36),
        (seated, 4, 64),
        (seated, 5, 64),
        ([*seated, "r4"], 6, 64),
    ]


def test_caps_never_leave_their_range():
    sched = create_scheduler(
        policy="adaptive", max_num_batched_tokens=64, max_num_seqs=4, target_tpot=0.05
    )
    sched.add_request(create_request("a", prompt_len=8, max_tokens=100))
    for _ in range(10):
        out = sched.schedule()
        sched.update(out, sample_all(out, duration=1.0))
    assert (sched.policy.max_num_seqs, sched.policy.token_budget) == (1, 16)
    for _ in range(100):
        out = sched.schedule()
        sched.update(out, sample_all(out, duration=0.001))
    assert (sched.policy.max_num_seqs, sched.policy.token_budget) == (4, 64)
