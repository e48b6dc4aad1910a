"""The Hermes / Qwen2.5 form: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Text outside the tags is content. Content is held back while its tail could be the start of a
`<tool_call>` tag, and whitespace is held back until more content follows it (whitespace around
calls is not content), so no part of the tag syntax ever reaches the content.
"""

from __future__ import annotations

import enum
from typing import Any

from heddle.tools.base import (
    IdFactory,
    ParseDelta,
    ToolCallFormat,
    ToolCallStream,
    dumps,
    function_schema,
    hold_back_length,
    new_call_id,
)
from heddle.tools.call_body import CallBody

START = "<tool_call>"
END = "</tool_call>"
_WHITESPACE = " \t\n\r"


class _Mode(enum.Enum):
    TEXT = enum.auto()
    CALL = enum.auto()  # inside <tool_call>, reading the JSON object
    AFTER_CALL = enum.auto()  # the object is read; expecting </tool_call>
    SKIP = enum.auto()  # a malformed call: skipping to </tool_call>


class HermesStream(ToolCallStream):
    def __init__(self, new_id: IdFactory) -> None:
        super().__init__(new_id)
        self._mode = _Mode.TEXT
        self._pending = ""  # text not yet handed out
        self._body: CallBody | None = None
        self._skipped: list[str] = []  # a malformed, uncommitted call's text

    def _feed(self, text: str, delta: ParseDelta) -> None:
        self._pending += text
        while self._pending:
            mode = self._mode
            if mode is _Mode.TEXT:
                if not self._text(delta):
                    return
            elif mode is _Mode.CALL:
                if not self._call(delta):
                    return
            elif mode is _Mode.AFTER_CALL:
                if not self._after_call():
                    return
            elif not self._skip(delta):
                return

    def _text(self, delta: ParseDelta) -> bool:
        pending = self._pending
        start = pending.find(START)
        if start >= 0:
            # Whitespace just before a call is not content.
            self._emit_content(delta, pending[:start].rstrip(_WHITESPACE))
            self._pending = pending[start + len(START) :]
            self._body = CallBody(self)
            self._mode = _Mode.CALL
            return True
        keep = hold_back_length(pending, START)
        safe = pending[: len(pending) - keep]
        stripped = safe.rstrip(_WHITESPACE)
        self._emit_content(delta, stripped)
        self._pending = pending[len(stripped) :]
        return False

    def _call(self, delta: ParseDelta) -> bool:
        body = self._body
        assert body is not None
        used = body.feed(self._pending, delta)
        rest = self._pending[used:]
        if body.failed:
            self._skipped = [] if body.committed else [START, *body.raw]
            self._mode = _Mode.SKIP
        elif body.done:
            self._mode = _Mode.AFTER_CALL
        else:
            self._pending = ""
            return False
        self._pending = rest
        return True

    def _after_call(self) -> bool:
        pending = self._pending.lstrip(_WHITESPACE)
        if not pending:
            self._pending = ""
            return False
        if pending.startswith(END):
            self._pending = pending[len(END) :]
            self._mode = _Mode.TEXT
            return True
        if END.startswith(pending) or START.startswith(pending):
            self._pending = pending
            return False  # wait for the rest of the tag
        # The model left out the end tag: what follows is content (or the next call).
        self._pending = pending
        self._mode = _Mode.TEXT
        return True

    def _skip(self, delta: ParseDelta) -> bool:
        pending = self._pending
        end = pending.find(END)
        if end < 0:
            keep = hold_back_length(pending, END)
            if self._skipped:
                self._skipped.append(pending[: len(pending) - keep])
            self._pending = pending[len(pending) - keep :]
            return False
        if self._skipped:
            # A malformed call that never got a name is given back as content, tags and all:
            # nothing the model wrote is lost.
            self._emit_content(delta, "".join(self._skipped) + pending[: end + len(END)])
            self._skipped = []
        self._pending = pending[end + len(END) :]
        self._mode = _Mode.TEXT
        return True

    def _finish(self, delta: ParseDelta) -> None:
        mode = self._mode
        pending = self._pending
        self._pending = ""
        if mode is _Mode.TEXT:
            self._emit_content(delta, pending.rstrip(_WHITESPACE))
        elif mode is _Mode.CALL:
            body = self._body
            assert body is not None
            if body.committed:
                body.finish(delta)
            else:
                self._emit_content(delta, (START + "".join(body.raw)).rstrip(_WHITESPACE))
        elif mode is _Mode.SKIP and self._skipped:
            self._emit_content(delta, "".join([*self._skipped, pending]).rstrip(_WHITESPACE))


class HermesFormat(ToolCallFormat):
    name = "hermes"

    def stream(self, new_id: IdFactory = new_call_id) -> HermesStream:
        return HermesStream(new_id)

    def render_calls(self, calls: list[tuple[str, str]]) -> str:
        return "\n".join(
            f'{START}\n{{"name": {dumps(name)}, "arguments": {arguments}}}\n{END}'
            for name, arguments in calls
        )

    def render_tools(self, tools: list[dict[str, Any]]) -> str:
        # The wording of Qwen2.5's chat template.
        definitions = "\n".join(dumps(tool) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{definitions}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            f"within {START}{END} XML tags:\n"
            f'{START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{END}'
        )

    def render_tool_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def forced_format(self, functions: list[dict[str, Any]], at_most_one: bool) -> dict[str, Any]:
        tags = [
            {
                "type": "tag",
                "begin": f'{START}\n{{"name": {dumps(f["name"])}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": function_schema(f)},
                "end": f"}}\n{END}",
            }
            for f in functions
        ]
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": at_most_one,
        }
