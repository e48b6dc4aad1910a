from __future__ import annotations

from heddle.request import RequestStatus
from tests.core.policies.harness import Arrival, make_engine, run
from tests.factories import create_request, create_scheduler, sample_all


def scheduled(out):
    return out.scheduled_tokens()


def test_waiting_requests_are_served_most_urgent_first():
    sched = create_scheduler(policy="priority", max_num_seqs=2)
    for rid, priority in [("p2", 2), ("p0", 0), ("p1", 1)]:
        sched.add_request(
            create_request(rid, prompt_len=4, priority=priority, first_token=ord(rid[1]) * 10)
        )
    out = sched.schedule()
    assert out.request_ids == ["p0", "p1"]
    assert [r.request_id for r in sched.waiting] == ["p2"]


def test_high_priority_arrival_preempts_low_priority_when_seats_are_full():
    sched = create_scheduler(policy="priority", max_num_seqs=1)
    low = create_request("low", prompt_len=8, max_tokens=4, priority=2)
    sched.add_request(low)
    out = sched.schedule()
    sched.update(out, sample_all(out))
    sched.add_request(
        create_request("high", prompt_len=8, max_tokens=4, priority=0, first_token=300)
    )
    out = sched.schedule()
    assert scheduled(out) == {"high": 8}
    assert out.preempted_request_ids == ["low"]
    assert low.status is RequestStatus.PREEMPTED and low.num_output_tokens == 1


def test_equal_priority_does_not_preempt():
    sched = create_scheduler(policy="priority", max_num_seqs=1)
    sched.add_request(create_request("first", prompt_len=8, priority=1))
    out = sched.schedule()
    sched.update(out, sample_all(out))
    sched.add_request(create_request("second", prompt_len=8, priority=1, first_token=300))
    out = sched.schedule()
    assert scheduled(out) == {"first": 1}
    assert out.preempted_request_ids == []


def test_preemption_can_be_switched_off():
    sched = create_scheduler(policy="priority", max_num_seqs=1, preempt=False)
    sched.add_request(create_request("low", prompt_len=8, priority=2))
    out = sched.schedule()
    sched.update(out, sample_all(out))
    sched.add_request(create_request("high", prompt_len=8, priority=0, first_token=300))
    assert scheduled(sched.schedule()) == {"low": 1}


def stream_with_one_low_priority_request(aging_seconds):
    # One seat; a priority-0 request arrives every 0.02 s and needs 3 steps (0.03 s): the
    # high-priority backlog never drains while the stream lasts.
    engine, _, clock = make_engine("priority", max_num_seqs=1, aging_seconds=aging_seconds)
    arrivals = [Arrival("low", 0.0, 4, 3, fields={"priority": 5})]
    arrivals += [
        Arrival(f"h{i:03d}", round(0.02 * i, 3), 4, 3, fields={"priority": 0}) for i in range(100)
    ]
    run(engine, clock, arrivals)
    return {r.request_id: r for r in engine.finished_records}


def test_aging_lets_low_priority_run_under_a_stream_of_high_priority():
    records = stream_with_one_low_priority_request(aging_seconds=0.05)
    low = records.pop("low")
    # Aged by 5 levels at 0.25 s: ahead of every request arriving later, behind earlier ones.
    for record in records.values():
        if record.arrival_time > 0.25:
            assert record.first_scheduled_time >= low.finish_time
        else:
            assert record.finish_time <= low.first_scheduled_time
    assert low.num_preemptions == 0


def test_without_aging_the_low_priority_request_runs_last():
    records = stream_with_one_low_priority_request(aging_seconds=1000.0)
    low = records.pop("low")
    assert all(r.finish_time <= low.first_scheduled_time for r in records.values())


def test_high_priority_arrival_preempts_low_priority_when_blocks_are_short():
    # 5 blocks of 4 tokens: low holds 3 of them; high's 12-token prompt needs 3.
    sched = create_scheduler(policy="priority", num_blocks=5, max_num_seqs=8)
    sched.add_request(create_request("low", prompt_len=10, max_tokens=4, priority=1))
    out = sched.schedule()
    sched.update(out, sample_all(out))
    sched.add_request(create_request("high", prompt_len=12, priority=0, first_token=300))
    out = sched.schedule()
    assert scheduled(out) == {"high": 12}
    assert out.preempted_request_ids == ["low"]
