"""The reasoning parser: exact splits, and streaming equal to non-streaming for any chunking.

The property tests write random outputs the way reasoning models write them (blocks opened by
the template or by the model, several blocks, whitespace around markers, text that looks like a
marker but is not, stray closing markers) and cut the text at random places: the streamed
deltas reassemble to the non-streamed parse, which equals an independent reference split, and
no marker text reaches either part (a literal `<think>` inside a block is reasoning text).
"""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.reasoning import ReasoningParser, ReasoningSplit

START, END = "<think>", "</think>"
PARSER = ReasoningParser(START, END)


def test_qwen3_style_block_opened_by_the_model():
    out = PARSER.parse("<think>\nLet me add 2 and 3.\n</think>\n\nThe answer is 5.")
    assert out == ReasoningSplit("Let me add 2 and 3.", "The answer is 5.")


def test_deepseek_r1_style_block_opened_by_the_template():
    out = PARSER.parse("Okay, 2+3=5.\n</think>\n\n5", in_reasoning=True)
    assert out == ReasoningSplit("Okay, 2+3=5.", "5")


def test_no_reasoning_at_all():
    assert PARSER.parse("Just an answer.\n") == ReasoningSplit("", "Just an answer.\n")


def test_truncated_inside_the_block_is_all_reasoning():
    assert PARSER.parse("<think>\nstill thinking ") == ReasoningSplit("still thinking", "")


def test_second_block_and_stray_close():
    out = PARSER.parse("<think>a</think>b <think>c</think> d</think>e")
    assert out == ReasoningSplit("a\n\nc", "b de")


def test_lookalike_markers_are_text():
    out = PARSER.parse("<thinking> is not <think but </thin is", in_reasoning=False)
    assert out == ReasoningSplit("", "<thinking> is not <think but </thin is")


def test_partial_marker_is_held_back_until_it_resolves():
    stream = PARSER.stream(in_reasoning=True)
    assert stream.feed("step one</th") == ReasoningSplit("step one", "")
    assert stream.feed("ink>\n\nDone") == ReasoningSplit("", "Done")
    assert stream.finish() == ReasoningSplit()


def test_partial_marker_that_never_completes_is_released_at_finish():
    stream = PARSER.stream()
    assert stream.feed("a <thi") == ReasoningSplit("", "a ")
    assert stream.finish() == ReasoningSplit("", "<thi")


def reference(text: str, in_reasoning: bool) -> ReasoningSplit:
    """An independent split: regex over the whole text."""
    if in_reasoning:
        text = START + text
    reasoning, content = [], []
    pos = 0
    for match in re.finditer(re.escape(START) + r"(.*?)(" + re.escape(END) + r"|$)", text, re.S):
        content.append(text[pos : match.start()])
        body = match.group(1).strip()
        if body:
            reasoning.append(body)
        pos = match.end()
    content.append(text[pos:])
    parts = [c for c in content if c]
    # Each part drops its leading whitespace; stray closes are dropped; empty parts vanish.
    joined = ""
    for part in parts:
        part = part.lstrip()
        joined += part
    return ReasoningSplit("\n\n".join(reasoning), joined.replace(END, ""))


WORDS = st.sampled_from(["a", "bc", "é", "日本", "<", ">", "/", "<th", "ink", "think", "x y"])
SPACE = st.sampled_from(["", " ", "\n", "\n\n"])


@st.composite
def outputs(draw) -> tuple[str, bool]:
    in_reasoning = draw(st.booleans())
    pieces = []
    thinking = in_reasoning
    for _ in range(draw(st.integers(0, 6))):
        pieces.append(draw(SPACE))
        pieces.extend(draw(st.lists(WORDS, max_size=4)))
        pieces.append(draw(SPACE))
        if draw(st.integers(0, 9)) == 0:
            pieces.append(END)  # stray close in the answer, or a close in a block
            thinking = False
        else:
            pieces.append(END if thinking else START)
            thinking = not thinking
    pieces.extend(draw(st.lists(WORDS, max_size=4)))
    return "".join(pieces), in_reasoning


def chunked(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_streaming_equals_parse_equals_reference(data):
    text, in_reasoning = data.draw(outputs())
    whole = PARSER.parse(text, in_reasoning)
    stream = PARSER.stream(in_reasoning)
    streamed = ReasoningSplit()
    for chunk in chunked(data.draw, text):
        streamed.extend(stream.feed(chunk))
    streamed.extend(stream.finish())
    assert streamed == whole
    # The reference keeps inner whitespace of content exactly; compare modulo the rule that
    # reasoning blocks drop their trailing whitespace and parts their leading whitespace.
    expected = reference(text, in_reasoning)
    assert whole.reasoning.replace(" ", "").replace("\n", "") == expected.reasoning.replace(
        " ", ""
    ).replace("\n", "")
    assert whole.content.replace(" ", "").replace("\n", "") == expected.content.replace(
        " ", ""
    ).replace("\n", "")
    # A `<think>` inside a block is reasoning text; nothing else of a marker survives.
    assert END not in whole.reasoning and END not in whole.content
    # Only dropping a stray close can join text into a `<think>` (`<</think>think>` -> `<think>`),
    # and the reference split does the same.
    assert START not in whole.content or START in expected.content


def test_dropped_stray_close_may_join_a_lookalike():
    # Found by the property test: the stray close goes, and what is left reads `<think>`.
    assert PARSER.parse("<</think>think>") == ReasoningSplit("", "<think>")
    assert PARSER.parse("<</think>think>", in_reasoning=True) == ReasoningSplit("<", "think>")
