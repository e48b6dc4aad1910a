"""What every tool-call format shares: the parsed calls, the streamed deltas, and the interface.

A `ToolCallFormat` is one model family's way of writing tool calls (Hermes/Qwen2.5's
`<tool_call>` tags, Llama 3's bare JSON). It parses the model's text into calls, renders calls
and tool definitions back into text for chat templates that know nothing of tools, and
describes the text of a forced call as a grammar (an xgrammar structural tag, as plain JSON).

Parsing is incremental: `ToolCallFormat.stream()` returns a `ToolCallStream` fed with text as
it is generated, and `parse(text)` is that same stream fed once. A streamed response is
therefore the non-streamed one cut into pieces, by construction.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IdFactory = Callable[[], str]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as the model wrote it

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of call number `index`: its id and name first, then argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        delta: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            delta["id"] = self.id
            delta["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        delta["function"] = function
        return delta


@dataclass(slots=True)
class ParseDelta:
    """What one piece of model text adds: content, and pieces of tool calls."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)

    def extend(self, other: ParseDelta) -> None:
        self.content += other.content
        for delta in other.tool_calls:
            last = self.tool_calls[-1] if self.tool_calls else None
            if last is not None and last.index == delta.index and delta.id is None:
                last.arguments += delta.arguments
            else:
                self.tool_calls.append(delta)


@dataclass(slots=True)
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall]


class ToolCallStream(abc.ABC):
    """Incremental parser of one completion's text.

    Subclasses implement `_feed` and `_finish`; this class assembles the calls it has emitted,
    so `calls` and `content` are always the concatenation of the deltas handed out.
    """

    def __init__(self, new_id: IdFactory) -> None:
        self._new_id = new_id
        self._names: list[str] = []
        self._ids: list[str] = []
        self._arguments: list[list[str]] = []
        self._content: list[str] = []
        self._finished = False

    def feed(self, text: str) -> ParseDelta:
        if self._finished:
            raise RuntimeError("the stream is finished")
        delta = ParseDelta()
        if text:
            self._feed(text, delta)
        return delta

    def finish(self) -> ParseDelta:
        """The text is complete: flush what was held back."""
        delta = ParseDelta()
        if not self._finished:
            self._finished = True
            self._finish(delta)
        return delta

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(self._ids[i], self._names[i], "".join(self._arguments[i]))
            for i in range(len(self._names))
        ]

    # -- for subclasses ----------------------------------------------------------------------
    def _emit_content(self, delta: ParseDelta, text: str) -> None:
        if text:
            self._content.append(text)
            delta.content += text

    def _open_call(self, delta: ParseDelta, name: str) -> int:
        index = len(self._names)
        call_id = self._new_id()
        self._names.append(name)
        self._ids.append(call_id)
        self._arguments.append([])
        delta.tool_calls.append(ToolCallDelta(index, call_id, name, ""))
        return index

    def _emit_arguments(self, delta: ParseDelta, index: int, text: str) -> None:
        if not text:
            return
        self._arguments[index].append(text)
        last = delta.tool_calls[-1] if delta.tool_calls else None
        if last is not None and last.index == index:
            last.arguments += text
        else:
            delta.tool_calls.append(ToolCallDelta(index, arguments=text))

    def _has_arguments(self, index: int) -> bool:
        return bool(self._arguments[index])

    @abc.abstractmethod
    def _feed(self, text: str, delta: ParseDelta) -> None: ...

    @abc.abstractmethod
    def _finish(self, delta: ParseDelta) -> None: ...


class ToolCallFormat(abc.ABC):
    """One model family's tool-call syntax."""

    name: str = ""

    @abc.abstractmethod
    def stream(self, new_id: IdFactory = new_call_id) -> ToolCallStream:
        """A fresh incremental parser for one completion."""

    def parse(self, text: str, new_id: IdFactory = new_call_id) -> ParsedMessage:
        stream = self.stream(new_id)
        stream.feed(text)
        stream.finish()
        content = stream.content
        return ParsedMessage(content or None, stream.calls)

    @abc.abstractmethod
    def render_calls(self, calls: list[tuple[str, str]]) -> str:
        """The text the model would have written for these (name, arguments JSON) calls."""

    @abc.abstractmethod
    def render_tools(self, tools: list[dict[str, Any]]) -> str:
        """Instructions and tool definitions, for a system prompt."""

    @abc.abstractmethod
    def render_tool_result(self, content: str) -> str:
        """A tool's answer, as the model expects to read it."""

    @abc.abstractmethod
    def forced_format(self, functions: list[dict[str, Any]], at_most_one: bool) -> dict[str, Any]:
        """An xgrammar structural-tag format for text that is one or more calls (exactly one
        when `at_most_one`) of the given functions and nothing else."""


def function_schema(function: dict[str, Any]) -> dict[str, Any] | bool:
    """A function's parameters schema; any JSON object when it declares none."""
    parameters = function.get("parameters")
    if parameters is None:
        return {"type": "object"}
    return parameters


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def hold_back_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
