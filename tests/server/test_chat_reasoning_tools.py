"""Reasoning and tool calls in one reply (Qwen3-style: `<think>...</think>`, then calls in the
content): the reasoning is split off first, the calls are read from the content after it, and
the streamed deltas, chunked anywhere, reassemble to the same message."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from heddle.reasoning import ReasoningParser
from heddle.server.chat import _View
from heddle.server.reasoning import ReasoningView
from heddle.tools.hermes import HermesFormat

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = f"<think>\nThe user wants the weather: <tool_call> is how I call it.\n</think>\n\n{CALL}"


def view() -> _View:
    reasoning = ReasoningView(ReasoningParser("<think>", "</think>"), starts_in_thinking=False)
    return _View(None, None, "chatcmpl-test", HermesFormat(), reasoning)  # type: ignore[arg-type]


def output(text: str, delta: str = "", finished: bool = True) -> SimpleNamespace:
    return SimpleNamespace(index=0, text=text, delta_text=delta, finished=finished)


def test_calls_are_read_after_the_reasoning():
    message, has_calls = view()._message(output(TEXT))
    assert has_calls
    assert message["reasoning"] == message["reasoning_content"] == (
        "The user wants the weather: <tool_call> is how I call it."
    )  # a tag inside the reasoning is reasoning, not a call
    assert not message["content"]
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


@pytest.mark.parametrize("seed", range(20))
def test_streamed_reasoning_and_calls_reassemble_to_the_message(seed):
    rng = random.Random(seed)
    text = TEXT + ("\nDone." if seed % 2 else "")
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    v, parsers = view(), {}
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(pieces):
        delta = v._delta(parsers, output("", piece, finished=i == len(pieces) - 1))
        assert delta.get("reasoning") == delta.get("reasoning_content")
        reasoning += delta.get("reasoning", "")
        content += delta.get("content", "")
        for d in delta.get("tool_calls", []):
            call = calls.setdefault(d["index"], [d["function"].get("name"), ""])
            call[1] += d["function"]["arguments"]
    message, _ = view()._message(output(text))
    assert reasoning == message["reasoning"]
    assert content == (message["content"] or "")
    assert [tuple(c) for c in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]
