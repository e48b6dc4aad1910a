"""Property tests of the tool-call parsers: random calls, random chunkings.

For random tool calls written the way a model writes them (random whitespace, key order,
separators, indentation, tricky characters in strings), and any cutting of that text into
chunks: the non-streamed parse gives exactly the calls and content that were written, the
streamed deltas reassemble to the non-streamed parse, and no tool-call markup ever reaches
the content. The same agreement holds for every truncation of the text (a reply cut off by
max_tokens): streaming and non-streaming never disagree.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.tools import ToolCallFormat, make_format
from heddle.tools.hermes import END, START

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
# Strings with the characters that break naive parsers: braces, brackets, quotes, escapes,
# the tags themselves, separators, non-ASCII.
TRICKY = st.lists(
    st.sampled_from([*'ab {}[]",:;\\/<>\n\t', "é", "日", "🙂", START, END]), max_size=12
).map("".join)
SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(
    allow_nan=False, allow_infinity=False, width=32
) | TRICKY
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(TRICKY, JSON_VALUES, max_size=4)
WHITESPACE = st.sampled_from(["", " ", "\n", "\n\n", " \n "])
# Content a model writes outside calls: anything but the start tag.
CONTENT = (
    st.lists(st.sampled_from([*"Hello, world! {}<>/_\n ", "<tool", "call>", "é"]), max_size=20)
    .map("".join)
    .filter(lambda s: START not in s)
)


@dataclass
class Written:
    text: str
    calls: list[tuple[str, str]]  # (name, arguments JSON text as written)
    content: str | None


@st.composite
def call_json(draw, args_key: str | None = None) -> tuple[str, str, str]:
    """(name, arguments text, the call's JSON object text)."""
    name = draw(NAMES)
    arguments = draw(ARGUMENTS)
    indent = draw(st.sampled_from([None, None, 2]))
    separators = draw(st.sampled_from([None, (",", ":"), (", ", ": ")]))
    args_text = json.dumps(arguments, indent=indent, separators=separators,
                           ensure_ascii=draw(st.booleans()))
    key = args_key or draw(st.sampled_from(["arguments", "parameters"]))
    ws = draw(WHITESPACE)
    members = [f'"name":{ws}{json.dumps(name)}', f'"{key}":{ws}{args_text}']
    if draw(st.booleans()):
        members.reverse()  # some models write the arguments first
    if draw(st.booleans()):
        members.insert(1, '"id": "x"')  # an extra key is ignored
    body = "{" + ws + ("," + ws).join(members) + ws + "}"
    return name, args_text, body


@st.composite
def hermes_text(draw) -> Written:
    calls = draw(st.lists(call_json(), max_size=3))
    segments = [draw(CONTENT) for _ in range(len(calls) + 1)]
    parts = [segments[0]]
    for (_, _, body), segment in zip(calls, segments[1:], strict=True):
        parts.append(f"{START}{draw(WHITESPACE)}{body}{draw(WHITESPACE)}{END}")
        parts.append(segment)
    content = "".join(s.rstrip(" \t\n\r") for s in segments)
    return Written("".join(parts), [(n, a) for n, a, _ in calls], content or None)


@st.composite
def llama3_text(draw) -> Written:
    calls = draw(st.lists(call_json(), min_size=1, max_size=3))
    separator = draw(st.sampled_from([";", "; ", " ;\n"]))
    prefix = draw(st.sampled_from(["", "<|python_tag|>", " "]))
    text = prefix + separator.join(body for _, _, body in calls) + draw(WHITESPACE)
    return Written(text, [(n, a) for n, a, _ in calls], None)


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def stream_in_chunks(fmt: ToolCallFormat, text: str, cuts: list[int]):
    """(content, [(id, name, arguments)], every content delta) from streaming `text`."""
    stream = fmt.stream(_ids())
    bounds = [0, *sorted(set(cuts)), len(text)]
    deltas = [stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    deltas.append(stream.finish())
    content = ""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        content += delta.content
        for piece in delta.tool_calls:
            if piece.index not in calls:
                # The first piece of a call carries its id and name, and nothing comes before.
                assert piece.id is not None and piece.name is not None
                assert piece.index == len(calls)
                calls[piece.index] = [piece.id, piece.name, ""]
            else:
                assert piece.id is None and piece.name is None
            calls[piece.index][2] += piece.arguments
    return content, [tuple(c) for c in calls.values()], [d.content for d in deltas]


def parsed(fmt: ToolCallFormat, text: str):
    message = fmt.parse(text, _ids())
    return message.content or "", [(c.id, c.name, c.arguments) for c in message.tool_calls]


def cuts_for(text_strategy):
    return text_strategy.flatmap(
        lambda w: st.tuples(st.just(w), st.lists(st.integers(0, len(w.text)), max_size=12))
    )


@settings(max_examples=150, deadline=None)
@given(cuts_for(hermes_text()))
def test_hermes_streamed_equals_written_and_parsed(case):
    written, cuts = case
    fmt = make_format("hermes")
    content, calls = parsed(fmt, written.text)
    assert [(name, args) for _, name, args in calls] == written.calls
    assert (content or None) == written.content
    streamed_content, streamed_calls, pieces = stream_in_chunks(fmt, written.text, cuts)
    assert streamed_content == content
    assert streamed_calls == calls
    for piece in pieces:
        assert START not in piece and END not in piece


@settings(max_examples=150, deadline=None)
@given(cuts_for(llama3_text()))
def test_llama3_streamed_equals_written_and_parsed(case):
    written, cuts = case
    fmt = make_format("llama3_json")
    content, calls = parsed(fmt, written.text)
    assert [(name, args) for _, name, args in calls] == written.calls
    assert content == ""
    streamed_content, streamed_calls, pieces = stream_in_chunks(fmt, written.text, cuts)
    assert streamed_content == "" and streamed_calls == calls
    assert all("python_tag" not in p for p in pieces)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["hermes", "llama3_json"]).flatmap(
        lambda name: st.tuples(
            st.just(name),
            hermes_text() if name == "hermes" else llama3_text(),
        )
    ).flatmap(
        lambda nw: st.tuples(
            st.just(nw[0]),
            st.integers(0, len(nw[1].text)).map(lambda k, text=nw[1].text: text[:k]),
        )
    ).flatmap(
        lambda nt: st.tuples(
            st.just(nt), st.lists(st.integers(0, len(nt[1])), max_size=8)
        )
    )
)
def test_truncated_text_streams_as_it_parses(case):
    (name, text), cuts = case
    fmt = make_format(name)
    content, calls = parsed(fmt, text)
    streamed_content, streamed_calls, _ = stream_in_chunks(fmt, text, cuts)
    assert (streamed_content, streamed_calls) == (content, calls)


@settings(max_examples=100, deadline=None)
@given(CONTENT, st.lists(st.integers(0, 40), max_size=8))
def test_plain_text_is_content(text, cuts):
    fmt = make_format("hermes")
    content, calls = parsed(fmt, text)
    assert calls == [] and content == text.rstrip(" \t\n\r")
    assert stream_in_chunks(fmt, text, [c for c in cuts if c <= len(text)])[:2] == (content, [])
