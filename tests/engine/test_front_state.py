"""The front end's per-request state: deltas in, detokenized RequestOutputs and Stops out."""

from __future__ import annotations

import asyncio

from heddle.engine.async_engine import RequestStream
from heddle.engine.wire import Delta, Stop
from heddle.request import SamplingParams
from tests.server.fakes import CharTokenizer


def _state(params: SamplingParams):
    from heddle.engine.front_state import RequestState

    stream = RequestStream("r", asyncio.new_event_loop())
    return RequestState("r", "hi", [ord("h"), ord("i")], params, stream, CharTokenizer())


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_deltas_become_text_deltas_and_whole_outputs():
    state = _state(SamplingParams(max_tokens=4))
    assert state.apply(Delta("r", 0, ids("ab"))) is None
    first = state.output()
    assert first.outputs[0].delta_text == "ab" and first.outputs[0].delta_token_ids == ids("ab")
    assert not first.finished
    state.apply(Delta("r", 0, ids("cd"), "length"))
    final = state.output()
    assert final.finished and final.outputs[0].finish_reason == "length"
    assert final.outputs[0].text == "abcd" and final.outputs[0].token_ids == ids("abcd")
    assert final.outputs[0].delta_token_ids == ids("cd") and final.prompt == "hi"


def test_a_stop_string_is_held_back_then_ends_the_sequence_and_asks_the_core_to_stop():
    state = _state(SamplingParams(max_tokens=50, stop=("xyz",)))
    state.apply(Delta("r", 0, ids("abx")))
    assert state.output().outputs[0].delta_text == "a"  # the last two could begin "xyz"
    state.apply(Delta("r", 0, ids("y")))
    assert state.output().outputs[0].delta_text == "b"  # "xy" is held back
    assert state.apply(Delta("r", 0, ids("z"))) == Stop("r", 0, "xyz")
    final = state.output()
    assert final.finished
    c = final.outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("ab", "stop", "xyz")
    # What the core made before it got the Stop is dropped.
    assert state.apply(Delta("r", 0, ids("q"), "abort")) is None
    assert state.output().outputs[0].text == "ab"


def test_a_stop_string_in_the_last_token_needs_no_stop_message():
    state = _state(SamplingParams(max_tokens=3, stop=("c",)))
    assert state.apply(Delta("r", 0, ids("abc"), "length")) is None
    c = state.output().outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("ab", "stop", "c")


def test_n_sequences_finish_one_by_one():
    state = _state(SamplingParams(n=2, max_tokens=2, logprobs=0))
    from heddle.core.outputs import TokenLogprobs

    state.apply(Delta("r", 1, ids("a"), logprobs=[TokenLogprobs(97, -0.5, [])]))
    state.apply(Delta("r", 0, ids("ab"), "length"))
    partial = state.output()
    assert not partial.finished
    assert [c.finish_reason for c in partial.outputs] == ["length", None]
    assert [lp.token_id for lp in partial.outputs[1].logprobs] == [97]
    state.apply(Delta("r", 1, ids("b"), "length"))
    assert state.output().finished
