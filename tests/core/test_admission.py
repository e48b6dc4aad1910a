"""Admission control: what it predicts, what it refuses, and what it reports."""

from __future__ import annotations

import pytest

from heddle.config import SchedulerConfig
from heddle.core.admission import QueueBound, SchedulerState, SLOAdmission, make_admission
from heddle.core.kv_cache import KVCacheManager
from heddle.core.policies import make_policy
from heddle.core.scheduler import Scheduler
from heddle.errors import HeddleError, QueueFullError
from heddle.request import RequestStatus
from tests.factories import create_request, create_scheduler, sample_all
from tests.sim.factories import scheduled, step


def _observed(departures_per_step: int, step_time: float, decode_tokens: int, num_steps: int):
    admission = SLOAdmission(slack=1.0, min_observed_seconds=0.0)
    now = 0.0
    for _ in range(num_steps):
        now += step_time
        output = step(
            *[scheduled(f"d{i}", 1, 10, num_prompt_tokens=5) for i in range(decode_tokens)]
        )
        admission.observe_step(now, step_time, output, departures_per_step)
    return admission


def _state(waiting, running, policy="fcfs", max_num_seqs=2, token_budget=32, now=1.0):
    return SchedulerState(now, waiting, running, make_policy(policy), max_num_seqs, token_budget)


def test_rates_are_what_was_observed() -> None:
    admission = _observed(departures_per_step=1, step_time=0.02, decode_tokens=2, num_steps=100)
    assert admission.departure_rate == pytest.approx(50.0)
    assert admission.step_time == pytest.approx(0.02)
    assert admission.prefill_per_step(32) == pytest.approx(30.0)


def test_a_seat_bound_prediction() -> None:
    admission = _observed(1, 0.02, 2, 100)
    running = [create_request(f"run{i}", arrival_time=0.0) for i in range(2)]
    for r in running:
        r.num_computed_tokens = r.num_tokens  # decoding
    # (they arrived just now: none has waited longer than the prediction)
    waiting = [
        create_request(f"w{i}", prompt_len=8, arrival_time=0.99 + 0.001 * i) for i in range(3)
    ]
    new = create_request("new", prompt_len=8, arrival_time=1.0)
    predicted, reason, ahead = admission.predict_ttft(new, _state(waiting, running))
    # 3 ahead + itself need 4 seats, none free: 4 / 50 per s; then its own 8-token prefill
    # takes one 20 ms step (30 tokens of budget left by 2 decodes).
    assert (reason, ahead) == ("seats", 3)
    assert predicted == pytest.approx(4 / 50 + 0.02)


def test_a_prefill_bound_prediction() -> None:
    admission = _observed(1, 0.02, 2, 100)
    waiting = [
        create_request(f"w{i}", prompt_len=60, arrival_time=0.99 + 0.001 * i) for i in range(3)
    ]
    new = create_request("new", prompt_len=60, arrival_time=1.0)
    predicted, reason, _ = admission.predict_ttft(new, _state(waiting, [], max_num_seqs=8))
    # 240 prefill tokens at 30 per 20 ms step: 8 steps; the seats are free.
    assert reason == "prefill"
    assert predicted == pytest.approx(8 * 0.02)


def test_a_queue_ahead_that_does_not_move_is_the_prediction() -> None:
    # The rates say a seat frees up every 20 ms, but a request the policy ranks ahead has
    # waited 3 s unscheduled (requests of higher rank keep overtaking it): that is the wait.
    admission = _observed(1, 0.02, 2, 100)
    running = [create_request(f"run{i}", priority=0) for i in range(2)]
    for r in running:
        r.num_computed_tokens = r.num_tokens
    stuck = create_request("stuck", arrival_time=-2.0, priority=5)
    urgent = [create_request(f"u{i}", arrival_time=0.99, priority=0) for i in range(2)]
    state = _state([stuck, *urgent], running, policy="priority")
    late_low = create_request("late-low", arrival_time=1.0, priority=5)
    predicted, reason, ahead = admission.predict_ttft(late_low, state)
    assert (reason, ahead) == ("stalled", 3) and predicted == pytest.approx(3.0)
    # An urgent newcomer is ahead of the stuck one: the stall is not its wait.
    predicted, reason, ahead = admission.predict_ttft(
        create_request("u", arrival_time=1.0, priority=0), state
    )
    assert reason == "seats" and ahead == 2 and predicted < 0.1
    # A preempted request waiting again is not evidence of a stalled queue (it was served).
    stuck.status = RequestStatus.PREEMPTED
    assert admission.predict_ttft(late_low, state)[1] == "seats"


def test_the_queue_ahead_is_the_policys() -> None:
    admission = _observed(1, 0.02, 2, 100)
    running = [create_request(f"run{i}", priority=0) for i in range(2)]
    for r in running:
        r.num_computed_tokens = r.num_tokens
    low = [create_request(f"low{i}", arrival_time=0.01 * i, priority=5) for i in range(20)]
    urgent = create_request("urgent", arrival_time=1.0, priority=0)
    late_low = create_request("late-low", arrival_time=1.0, priority=5)
    state = _state(low, running, policy="priority")
    assert admission.predict_ttft(urgent, state)[2] == 0
    assert admission.predict_ttft(late_low, state)[2] == 20
    state = _state(low, running, policy="fcfs")
    assert admission.predict_ttft(urgent, state)[2] == 20


def test_the_scheduler_refuses_what_would_miss_its_target() -> None:
    config = SchedulerConfig(
        max_num_batched_tokens=32,
        max_num_seqs=2,
        admission="slo",
        admission_options={"slack": 1.0, "min_observed_seconds": 0.0},
    )
    scheduler = Scheduler(config, KVCacheManager(256, 4), create_scheduler().clock)
    clock = scheduler.clock
    # Two long decodes hold both seats; the shedder has seen no departure in their steps, so
    # a newcomer's wait for a seat is unbounded.
    for i in range(2):
        scheduler.add_request(create_request(f"long{i}", max_tokens=1000, ttft_slo=0.5))
    for _ in range(5):
        out = scheduler.schedule()
        clock.advance(0.02)
        scheduler.update(out, sample_all(out, duration=0.02))
    with pytest.raises(QueueFullError) as refused:
        scheduler.add_request(create_request("refused", ttft_slo=0.5, arrival_time=clock.now()))
    error = refused.value
    assert error.reason == "seats" and error.request_class == "default"
    assert error.retry_after is not None and error.retry_after > 0
    assert "refused" not in scheduler.requests
    # Without a TTFT target there is nothing to miss: admitted.
    scheduler.add_request(create_request("no-slo", arrival_time=clock.now()))
    report = scheduler.admission.report()["default"]
    assert (report["offered"], report["admitted"], report["refused"]) == (4, 3, 1)
    assert report["refused_by_reason"] == {"seats": 1}


def test_a_refused_request_leaves_nothing_in_the_policy() -> None:
    config = SchedulerConfig(
        max_num_batched_tokens=32,
        max_num_seqs=1,
        policy="mlfq",
        admission="queue",
        admission_options={"max_waiting": 1},
    )
    scheduler = Scheduler(config, KVCacheManager(64, 4), create_scheduler().clock)
    scheduler.add_request(create_request("a"))
    with pytest.raises(QueueFullError):
        scheduler.add_request(create_request("b"))
    assert set(scheduler.policy._places) <= {"a"}  # type: ignore[attr-defined]


def test_queue_bounds_per_class() -> None:
    admission = QueueBound(max_waiting={"short": 2, "*": 1}, retry_after=3)
    waiting = [
        create_request("s0", request_class="short"),
        create_request("s1", request_class="short"),
        create_request("l0", request_class="long"),
    ]
    state = _state(waiting, [])
    assert admission.check(create_request("s2", request_class="short"), state) is not None
    assert admission.check(create_request("l1", request_class="long"), state) is not None
    assert admission.check(create_request("x0", request_class="other"), _state([], [])) is None
    refusal = admission.check(create_request("s3", request_class="short"), state)
    assert refusal is not None and refusal.retry_after == 3.0 and refusal.reason == "queue"
    report = admission.report()
    assert report["short"]["refused"] == 2 and report["long"]["refused"] == 1
    assert report["other"] == {**report["other"], "offered": 1, "admitted": 1, "refused": 0}


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(HeddleError, match="unknown admission"):
        make_admission("lottery")
    with pytest.raises(HeddleError, match="slack"):
        make_admission("slo", slack=0)
    with pytest.raises(HeddleError, match="admission 'slo'"):
        make_admission("slo", budget=3)
    with pytest.raises(HeddleError, match="max_waiting"):
        make_admission("queue", max_waiting=-1)
    with pytest.raises(HeddleError, match="unknown admission"):
        SchedulerConfig(admission="lottery")


def test_the_prefill_capacity_is_the_budget_the_policy_gave() -> None:
    # slo caps a step's token budget to hold running TPOTs: the shedder predicts with the
    # budget the steps actually had, not the configured one.
    admission = SLOAdmission(min_observed_seconds=0.0)
    for i in range(50):
        output = step(*[scheduled(f"d{k}", 1, 10, num_prompt_tokens=5) for k in range(2)])
        admission.observe_step(0.02 * (i + 1), 0.02, output, 0, token_budget=12)
    assert admission.prefill_per_step(32) == pytest.approx(10.0)


def _two_classes(policy: str, now: float):
    """30 loose (2 s target, priority 1) requests waiting, both seats held by decodes."""
    running = [create_request(f"run{i}", priority=0) for i in range(2)]
    for r in running:
        r.num_computed_tokens = r.num_tokens
    loose = [
        create_request(
            f"loose{i}", arrival_time=now - 0.01, priority=1, ttft_slo=2.0, request_class="long"
        )
        for i in range(30)
    ]
    return _state(loose, running, policy=policy, now=now)


def _newcomer(name: str, now: float, tight: bool):
    return create_request(
        name,
        arrival_time=now,
        priority=0 if tight else 1,
        ttft_slo=0.5 if tight else 2.0,
        request_class="short" if tight else "long",
    )


def test_a_loose_class_leaves_room_for_the_tighter_class_behind_it() -> None:
    # fcfs: the 30 loose requests are ahead of every newcomer, so a short newcomer is predicted
    # 31 seats / 50 per s + one 20 ms step = 0.64 s > 0.5: refused. A loose newcomer, predicted
    # the same, is within its own 2 s target but would add its seat to the wait of the short
    # requests behind it: it is held to their 0.5 s (before: admitted at 0.64 s).
    admission = _observed(1, 0.02, 2, 100)
    state = _two_classes("fcfs", now=1.0)
    assert admission.check(_newcomer("s", 1.0, tight=True), state).reason == "seats"
    refusal = admission.check(_newcomer("l", 1.0, tight=False), state)
    assert refusal is not None and refusal.predicted_ttft == pytest.approx(31 / 50 + 0.02)
    assert "0.5 s target of a class behind it" in refusal.message
    report = admission.report()
    assert report["long"]["held_to_tighter_target"] == 1
    assert report["long"]["refused_held_to_tighter_target"] == 1
    assert report["short"]["mean_queue_ahead_by_class"] == {"long": 30.0}
    # Once no short newcomer has found a loose request ahead for window_seconds (5 s), the
    # loose class is back to its own target.
    assert admission.check(_newcomer("l2", 6.5, tight=False), _two_classes("fcfs", 6.5)) is None


def test_an_order_that_serves_the_tight_class_first_keeps_the_loose_target() -> None:
    # priority: a short newcomer ranks ahead of the 30 loose requests (none ahead of it), so
    # the loose class delays no one tighter and is admitted against its own 2 s target.
    admission = _observed(1, 0.02, 2, 100)
    state = _two_classes("priority", now=1.0)
    assert admission.check(_newcomer("s", 1.0, tight=True), state) is None
    assert admission.check(_newcomer("l", 1.0, tight=False), state) is None
    assert admission.report()["long"]["held_to_tighter_target"] == 0
