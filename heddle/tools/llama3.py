"""The Llama 3.1 / 3.2 JSON form: the whole reply is `{"name": ..., "parameters": {...}}`,
optionally after `<|python_tag|>`, several calls separated by `;`.

A reply is taken for tool calls only when it starts (after whitespace) with `{` or the python
tag and its object's first key is `name` (or the arguments); anything else is content, given
out unchanged. The start is held back until that is decided.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from heddle.tools.base import (
    IdFactory,
    ParseDelta,
    ToolCallFormat,
    ToolCallStream,
    dumps,
    function_schema,
    new_call_id,
)
from heddle.tools.call_body import ARGUMENT_KEYS, CallBody

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
_WHITESPACE = " \t\n\r"


class _Mode(enum.Enum):
    START = enum.auto()  # deciding between content and calls
    CALL = enum.auto()
    BETWEEN = enum.auto()  # after a call: a separator and another call, or the end
    TEXT = enum.auto()  # content to the end


class Llama3JsonStream(ToolCallStream):
    def __init__(self, new_id: IdFactory) -> None:
        super().__init__(new_id)
        self._mode = _Mode.START
        self._pending = ""
        self._held = ""  # the reply's start while undecided (given back if it is content)
        self._body: CallBody | None = None
        self._discard = False  # a malformed call after good ones: the rest is dropped

    def _feed(self, text: str, delta: ParseDelta) -> None:
        self._pending += text
        while self._pending:
            mode = self._mode
            if mode is _Mode.START:
                if not self._start():
                    return
            elif mode is _Mode.CALL:
                if not self._call(delta):
                    return
            elif mode is _Mode.BETWEEN:
                if not self._between():
                    return
            else:
                self._text(delta)
                return

    def _start(self) -> bool:
        pending = self._pending
        stripped = pending.lstrip(_WHITESPACE)
        if not stripped:
            return False
        if stripped.startswith(PYTHON_TAG):
            self._held += pending[: len(pending) - len(stripped) + len(PYTHON_TAG)]
            self._pending = stripped[len(PYTHON_TAG) :]
            self._mode = _Mode.BETWEEN  # whitespace, then the first call
            return True
        if PYTHON_TAG.startswith(stripped):
            return False
        if stripped[0] == "{":
            self._held += pending[: len(pending) - len(stripped)]
            self._pending = stripped
            self._body = CallBody(self)
            self._mode = _Mode.CALL
            return True
        self._mode = _Mode.TEXT
        return True

    def _call(self, delta: ParseDelta) -> bool:
        body = self._body
        assert body is not None
        used = body.feed(self._pending, delta)
        rest = self._pending[used:]
        if not body.committed and (
            body.failed or (body.first_key is not None and body.first_key not in _CALL_KEYS)
        ):
            if self._names:
                # After a call, a malformed one ends the calls: what is left is dropped.
                self._pending = ""
                self._mode = _Mode.TEXT
                self._discard = True
                return False
            # Not a tool call after all: the reply is content, from its first character.
            self._pending = self._held + "".join(body.raw) + rest
            self._held = ""
            self._mode = _Mode.TEXT
            return True
        if body.failed:
            self._pending = ""
            self._mode = _Mode.TEXT
            self._discard = True
            return False
        if body.done:
            self._held = ""
            self._pending = rest
            self._mode = _Mode.BETWEEN
            return True
        self._pending = ""
        return False

    def _between(self) -> bool:
        pending = self._pending.lstrip(_WHITESPACE)
        if not pending:
            self._pending = ""
            return False
        if pending[0] == SEPARATOR:
            pending = pending[1:].lstrip(_WHITESPACE)
            if not pending:
                self._pending = SEPARATOR
                return False
        if pending[0] == "{":
            self._pending = pending
            self._body = CallBody(self)
            self._mode = _Mode.CALL
            return True
        if pending == SEPARATOR:
            self._pending = pending
            return False
        # Text after the calls is content; after a lone python tag, all of it is.
        self._pending = pending if self._names else self._held + pending
        self._held = ""
        self._mode = _Mode.TEXT
        return True

    def _text(self, delta: ParseDelta) -> None:
        if self._discard:
            self._pending = ""
            return
        pending = self._pending
        stripped = pending.rstrip(_WHITESPACE)
        self._emit_content(delta, stripped)
        self._pending = pending[len(stripped) :]

    def _finish(self, delta: ParseDelta) -> None:
        mode = self._mode
        if mode is _Mode.CALL:
            body = self._body
            assert body is not None
            if body.committed:
                body.finish(delta)
            elif not self._names:
                text = self._held + "".join(body.raw)
                self._emit_content(delta, text.strip(_WHITESPACE))
        elif mode is _Mode.START:
            self._emit_content(delta, self._pending.strip(_WHITESPACE))
        elif mode is _Mode.TEXT and not self._discard:
            self._emit_content(delta, self._pending.rstrip(_WHITESPACE))
        elif mode is _Mode.BETWEEN and not self._names:
            self._emit_content(delta, (self._held + self._pending).strip(_WHITESPACE))
        self._pending = ""


_CALL_KEYS = ("name", *ARGUMENT_KEYS)


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"

    def stream(self, new_id: IdFactory = new_call_id) -> Llama3JsonStream:
        return Llama3JsonStream(new_id)

    def render_calls(self, calls: list[tuple[str, str]]) -> str:
        return "; ".join(
            f'{{"name": {dumps(name)}, "parameters": {arguments}}}' for name, arguments in calls
        )

    def render_tools(self, tools: list[dict[str, Any]]) -> str:
        # The wording of Llama 3.1's chat template for custom tools.
        definitions = "\n\n".join(json.dumps(tool, indent=4) for tool in tools)
        return (
            "Given the following functions, please respond with a JSON for a function call "
            "with its proper arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of '
            "argument name and its value}. Do not use variables.\n\n"
            f"{definitions}"
        )

    def render_tool_result(self, content: str) -> str:
        return content

    def forced_format(self, functions: list[dict[str, Any]], at_most_one: bool) -> dict[str, Any]:
        tags = [
            {
                "type": "tag",
                "begin": f'{{"name": {dumps(f["name"])}, "parameters": ',
                "content": {"type": "json_schema", "json_schema": function_schema(f)},
                "end": "}",
            }
            for f in functions
        ]
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "; ",
            "at_least_one": True,
            "stop_after_first": at_most_one,
        }
