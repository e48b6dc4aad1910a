"""Engine bookkeeping on a virtual clock with a counting executor (no model needed)."""

from __future__ import annotations

import pytest

from heddle.clock import VirtualClock
from heddle.engine.detokenizer import IncrementalDetokenizer
from heddle.engine.engine import Engine
from heddle.errors import InvalidRequestError
from heddle.request import SamplingParams
from tests.factories import CountingExecutor, engine_config


def make_engine(num_blocks=64, **scheduler):
    clock = VirtualClock()
    executor = CountingExecutor(clock, step_time=0.01)
    config = engine_config(**scheduler)
    engine = Engine(
        config, executor, num_blocks=num_blocks, clock=clock, eos_token_id=2, max_model_len=512
    )
    return engine, executor, clock


def run(engine, max_steps=10_000):
    outputs = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
    return outputs


def test_all_requests_finish_with_their_lengths_and_no_block_leaks():
    engine, _, _ = make_engine(
        num_blocks=20, block_size=4, max_num_batched_tokens=32, max_num_seqs=4
    )
    lengths = {f"r{i}": 3 + 5 * i for i in range(8)}
    for rid, n in lengths.items():
        engine.add_request(
            rid, list(range(10, 30)), SamplingParams(max_tokens=100), true_output_len=n
        )
    outputs = run(engine)
    assert {rid: len(o.outputs[0].token_ids) for rid, o in outputs.items()} == lengths
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs.values())
    engine.check_integrity()
    assert len(engine.finished_records) == 8
    assert engine.scheduler.num_preemptions > 0  # 20 blocks are too few for 4 such requests


def test_records_have_consistent_times():
    engine, _, _ = make_engine()
    engine.add_request("a", [5] * 10, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.add_request("b", [6] * 10, SamplingParams(max_tokens=3, ignore_eos=True))
    run(engine)
    for record in engine.finished_records:
        assert record.arrival_time == 0.0
        assert record.first_token_time == pytest.approx(0.01)
        assert record.token_times == sorted(record.token_times)
        assert record.finish_time == record.token_times[-1]
        assert record.ttft <= record.e2e
    assert engine.step_stats[0].num_prefill_tokens == 20
    assert engine.step_stats[1].num_decode_tokens == 2


def test_n_sequences_share_the_prompt_blocks():
    engine, executor, _ = make_engine(block_size=4, max_num_batched_tokens=64)
    engine.add_request("g", list(range(10, 30)), SamplingParams(n=3, max_tokens=4, ignore_eos=True))
    outputs = run(engine)
    assert [c.index for c in outputs["g"].outputs] == [0, 1, 2]
    first_step = executor.outputs[0]
    assert first_step.request_ids == ["g-0"]
    second = {r.request_id: r.num_computed_tokens for r in executor.outputs[1].rows()}
    assert second == {"g-0": 20, "g-1": 16, "g-2": 16}  # children reuse 4 cached blocks
    engine.check_integrity()


def test_stall_time_is_charged_to_requests_left_out():
    engine, _, _ = make_engine(max_num_seqs=1)
    engine.add_request("a", [5] * 4, SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("b", [6] * 4, SamplingParams(max_tokens=3, ignore_eos=True))
    run(engine)
    records = {r.request_id: r for r in engine.finished_records}
    assert records["a"].stall_time == 0.0
    assert records["b"].stall_time == pytest.approx(0.03)  # the three steps a ran alone
    # In the first step a was no longer than b; in the next two it was.
    assert records["b"].blocked_by_longer_time == pytest.approx(0.02)


def test_abort_returns_final_output_and_frees_blocks():
    engine, _, _ = make_engine()
    engine.add_request("a", [5] * 9, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    out = engine.abort_request("a")
    assert out is not None and out.finished
    assert out.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


def test_bad_requests_are_rejected_without_side_effects():
    engine, _, _ = make_engine()
    with pytest.raises(InvalidRequestError, match="context"):
        engine.add_request("long", [5] * 600, SamplingParams())
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.add_request("mt", [5] * 10, SamplingParams(max_tokens=600))
    with pytest.raises(InvalidRequestError):
        engine.add_request("empty", [], SamplingParams())
    assert not engine.has_unfinished_requests()


class CharDecoder:
    """Token id i decodes to chr(i): a stand-in tokenizer to test the detokenizer's holdback."""

    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(chr(t) for t in token_ids)


def test_detokenizer_holds_back_partial_stop_strings():
    detok = IncrementalDetokenizer(CharDecoder(), [ord("x")], stop=("STOP",))
    streamed = ""
    for ch in "hello STO":
        detok.add_tokens([ord(ch)])
        streamed += detok.take_delta(finished=False)
    assert streamed == "hello "  # "STO" may begin the stop string: held back
    detok.add_tokens([ord("P"), ord("!")])
    assert detok.stop_hit == "STOP"
    streamed += detok.take_delta(finished=True)
    assert streamed == "hello " and detok.text == "hello "


def test_detokenizer_releases_held_text_that_is_not_a_stop():
    detok = IncrementalDetokenizer(CharDecoder(), [ord("x")], stop=("STOP",))
    for ch in "ST":
        detok.add_tokens([ord(ch)])
    assert detok.take_delta(finished=False) == ""
    detok.add_tokens([ord("x")])
    assert detok.take_delta(finished=True) == "STx"


def test_detokenizer_holds_back_the_longest_stop_string_of_several():
    """With stop=["STOP", "\n"], "STO" may still begin "STOP": it must not leak, even though
    the shortest stop string needs no holdback at all."""
    detok = IncrementalDetokenizer(CharDecoder(), [ord("x")], stop=("STOP", "\n"))
    streamed = ""
    for ch in "hi STO":
        detok.add_tokens([ord(ch)])
        streamed += detok.take_delta(finished=False)
        assert "S" not in streamed, streamed
    detok.add_tokens([ord("P")])
    assert detok.stop_hit == "STOP"
    streamed += detok.take_delta(finished=True)
    assert streamed == "hi "
    newline = IncrementalDetokenizer(CharDecoder(), [ord("x")], stop=("\n", "STOP"))
    for ch in "ok\nmore":
        newline.add_tokens([ord(ch)])
    assert newline.stop_hit == "\n" and newline.take_delta(finished=True) == "ok"


def test_a_group_is_queued_whole_or_not_at_all():
    from heddle.errors import QueueFullError

    engine, _, _ = make_engine(max_waiting=3)
    engine.add_request("a", [5] * 4, SamplingParams(n=2, max_tokens=2))
    with pytest.raises(QueueFullError):
        engine.add_request("b", [5] * 4, SamplingParams(n=2, max_tokens=2))
    assert len(engine.scheduler.waiting) == 2
    run(engine)
    engine.check_integrity()


def test_step_utilization_is_tokens_over_budget_of_the_steps_a_request_ran_in():
    engine, _, _ = make_engine(max_num_batched_tokens=20)
    engine.add_request("a", [5] * 10, SamplingParams(max_tokens=2, ignore_eos=True))
    run(engine)
    (record,) = engine.finished_records
    # Step 1 computes the 10 prompt tokens (10/20), step 2 one decode token (1/20).
    assert record.num_steps == 2
    assert record.step_utilization == pytest.approx((0.5 + 0.05) / 2)
