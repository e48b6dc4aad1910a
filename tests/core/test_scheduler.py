from __future__ import annotations

import pytest

from heddle.errors import InvalidRequestError, QueueFullError
from heddle.request import FinishReason, Request, RequestStatus, SamplingParams
from tests.factories import EOS, create_request, create_scheduler, sample_all, sampled_by_id


def scheduled_tokens(output):
    return output.scheduled_tokens()


def row(output, request_id):
    (found,) = [r for r in output.rows() if r.request_id == request_id]
    return found


def test_prefill_is_chunked_to_the_budget_and_mixed_with_decodes():
    sched = create_scheduler(max_num_batched_tokens=16, block_size=4)
    sched.add_request(create_request("a", prompt_len=6, max_tokens=5))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 6}
    assert out.sample == [True]
    sched.update(out, sample_all(out))
    sched.add_request(create_request("b", prompt_len=40, arrival_time=1.0, first_token=300))
    out = sched.schedule()
    # a's decode token comes first, then b's prefill takes the 15 budget tokens left.
    assert scheduled_tokens(out) == {"a": 1, "b": 15}
    assert out.sample == [True, False]
    assert out.num_computed_tokens[1] == 0
    sched.update(out, sample_all(out))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 1, "b": 15}
    assert out.num_computed_tokens[1] == 15
    sched.update(out, sample_all(out))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 1, "b": 10}
    assert out.sample[1]  # the chunk that reaches the end of the prompt samples


def test_long_prefill_token_threshold_caps_each_request_chunk():
    sched = create_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=10)
    sched.add_request(create_request("a", prompt_len=25, max_tokens=3))
    sched.add_request(create_request("b", prompt_len=6, max_tokens=3, first_token=300))
    out = sched.schedule()
    # a takes 10 of its 25 prompt tokens although 64 fit; b (under the threshold) all 6.
    assert scheduled_tokens(out) == {"a": 10, "b": 6}
    sched.update(out, sample_all(out))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 10, "b": 1}
    sched.update(out, sample_all(out))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 5, "b": 1}


def test_block_table_covers_the_scheduled_positions():
    sched = create_scheduler(block_size=4)
    sched.add_request(create_request("a", prompt_len=9, max_tokens=10))
    out = sched.schedule()
    (new,) = out.new_requests
    assert len(new.block_ids) == 3 and new.block_ids == sched.kv_cache.block_ids("a")
    assert new.token_ids == list(range(100, 109))
    sched.update(out, sample_all(out))
    sent = []
    for _ in range(4):  # positions 9, 10, 11 in the third block; 12 opens the fourth
        out = sched.schedule()
        assert out.new_requests == []  # the executor knows the request: only a row is sent
        sent.append(out.new_block_ids)
        sched.update(out, sample_all(out))
    assert sent == [{}, {}, {}, {"a": sched.kv_cache.block_ids("a")[3:]}]
    assert len(sched.kv_cache.block_ids("a")) == 4


def test_running_cap_limits_admission():
    sched = create_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        sched.add_request(create_request(f"r{i}", prompt_len=4, arrival_time=i))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"r0": 4, "r1": 4}
    assert [r.request_id for r in sched.waiting] == ["r2"]


def test_stop_conditions():
    sched = create_scheduler()
    eos = Request("eos", [5, 6], SamplingParams(max_tokens=10), 0.0, eos_token_id=EOS)
    stop_id = Request(
        "stop", [5, 6], SamplingParams(max_tokens=10, stop_token_ids=(9,)), 0.0, eos_token_id=EOS
    )
    ignore = Request(
        "ign", [5, 6], SamplingParams(max_tokens=2, ignore_eos=True), 0.0, eos_token_id=EOS
    )
    min_tok = Request(
        "min", [5, 6], SamplingParams(max_tokens=5, min_tokens=2), 0.0, eos_token_id=EOS
    )
    for r in (eos, stop_id, ignore, min_tok):
        sched.add_request(r)
    out = sched.schedule()
    tokens = {"eos": [EOS], "stop": [9], "ign": [EOS], "min": [EOS]}
    sched.update(out, sampled_by_id(out, tokens))
    assert eos.finish_reason is FinishReason.STOP and eos.stop_reason is None
    assert stop_id.finish_reason is FinishReason.STOP and stop_id.stop_reason == 9
    assert not ignore.is_finished and not min_tok.is_finished  # min_tokens holds EOS back
    out = sched.schedule()
    assert set(out.finished_request_ids) == {"eos", "stop"}  # the executor may drop their state
    sched.update(out, sampled_by_id(out, {"ign": [EOS], "min": [EOS]}))
    assert ignore.finish_reason is FinishReason.LENGTH
    assert min_tok.finish_reason is FinishReason.STOP
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache.num_used_blocks == 0
    assert set(sched.schedule().finished_request_ids) == {"ign", "min"}


def test_preemption_by_recompute_loses_nothing():
    # 6 blocks of 4 tokens: two requests of 8-token prompts growing to 16 tokens cannot both fit.
    sched = create_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a = create_request("a", prompt_len=8, max_tokens=8, arrival_time=0.0)
    b = create_request("b", prompt_len=8, max_tokens=8, arrival_time=1.0, first_token=200)
    sched.add_request(a)
    sched.add_request(b)
    preempted = []
    for _ in range(100):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        preempted += out.preempted_request_ids
        sched.update(out, sample_all(out))
        sched.check_integrity()
    assert preempted and preempted[0] == "b"  # FCFS preempts the latest arrival
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    assert b.record.num_preemptions >= 1
    assert sched.kv_cache.num_used_blocks == 0


def test_resumed_request_recomputes_prompt_and_outputs():
    sched = create_scheduler(
        num_blocks=6, block_size=4, max_num_batched_tokens=64, prefix_caching=False
    )
    sched.add_request(create_request("a", prompt_len=8, max_tokens=8))
    b = create_request("b", prompt_len=8, max_tokens=8, arrival_time=1.0, first_token=200)
    sched.add_request(b)
    resumed = None
    for _ in range(100):
        out = sched.schedule()
        for new in out.new_requests:
            if new.request_id == "b" and b.num_preemptions:
                resumed = new
        sched.update(out, sample_all(out))
        if resumed or not sched.has_unfinished_requests():
            break
    assert resumed is not None
    assert resumed.token_ids[:8] == list(range(200, 208))
    assert len(resumed.token_ids) > 8  # outputs generated before preemption are recomputed too


def test_prefix_cache_hit_skips_computed_blocks():
    sched = create_scheduler(block_size=4, max_num_batched_tokens=64)
    a = create_request("a", prompt_len=10, max_tokens=1)
    sched.add_request(a)
    out = sched.schedule()
    sched.update(out, sample_all(out))
    assert a.is_finished
    sched.add_request(create_request("b", prompt_len=10, max_tokens=1))
    out = sched.schedule()
    (s,) = out.rows()
    assert s.num_computed_tokens == 8 and s.num_new_tokens == 2
    assert out.new_requests[0].token_ids[8:] == [108, 109]
    assert sched.kv_cache.prefix_hit_rate == pytest.approx(8 / 20)


def test_child_of_group_waits_for_parent_prompt():
    sched = create_scheduler(block_size=4, max_num_batched_tokens=8)
    parent = create_request("p", prompt_len=12, max_tokens=2)
    child = create_request("c", prompt_len=12, max_tokens=2, parent_request_id="p")
    sched.add_request(parent)
    sched.add_request(child)
    out = sched.schedule()
    assert scheduled_tokens(out) == {"p": 8}
    sched.update(out, sample_all(out))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"p": 4}
    sched.update(out, sample_all(out))
    out = sched.schedule()
    # The parent's prompt is cached now: the child reuses 2 of its 3 blocks.
    assert scheduled_tokens(out) == {"p": 1, "c": 4}
    assert row(out, "c").num_computed_tokens == 8


def test_queue_bound_and_oversized_prompt_are_rejected():
    sched = create_scheduler(num_blocks=4, block_size=4)
    sched.config = type(sched.config)(max_waiting=1)
    sched.add_request(create_request("a", prompt_len=4))
    with pytest.raises(QueueFullError):
        sched.add_request(create_request("b", prompt_len=4))
    sched2 = create_scheduler(num_blocks=2, block_size=4)
    with pytest.raises(InvalidRequestError, match="KV cache"):
        sched2.add_request(create_request("big", prompt_len=8))


def test_abort_frees_blocks_at_once():
    sched = create_scheduler()
    sched.add_request(create_request("a", prompt_len=9))
    out = sched.schedule()
    sched.update(out, sample_all(out))
    assert sched.kv_cache.num_used_blocks == 3
    sched.finish_request("a", FinishReason.ABORT)
    assert sched.kv_cache.num_used_blocks == 0
    assert not sched.running
    assert sched.schedule().finished_request_ids == ["a"]


def test_request_status_moves_through_states():
    sched = create_scheduler()
    r = create_request("a", prompt_len=4, max_tokens=1)
    sched.add_request(r)
    assert r.status is RequestStatus.WAITING
    out = sched.schedule()
    assert r.status is RequestStatus.RUNNING
    assert r.record.first_scheduled_time == 0.0
    sched.update(out, sample_all(out))
    assert r.status is RequestStatus.FINISHED
