"""The JSON object of one call, `{"name": ..., "arguments": {...}}`, read as it streams."""

from __future__ import annotations

import json

from heddle.tools.base import ParseDelta, ToolCallStream
from heddle.tools.json_reader import ObjectReader, ValueKind

ARGUMENT_KEYS = ("arguments", "parameters")


class CallBody:
    """Feeds an `ObjectReader` and turns its values into call deltas on `stream`.

    The call opens (id and name emitted) once its name is read; argument text is emitted as
    it arrives when the name came first, else held until the name is known. Arguments given as
    a JSON string holding JSON (some models do this) are emitted decoded, when complete.
    """

    __slots__ = (
        "_args_key",
        "_held",
        "_name_text",
        "_stream",
        "_string_args",
        "index",
        "raw",
        "reader",
    )

    def __init__(self, stream: ToolCallStream) -> None:
        self._stream = stream
        self.reader = ObjectReader()
        self.index: int | None = None  # the call's index once its name is known
        self.raw: list[str] = []  # every character fed, for a fallback to content
        self._name_text: list[str] = []
        self._args_key: str | None = None
        self._held: list[str] = []  # argument text that arrived before the name
        self._string_args: list[str] = []

    @property
    def committed(self) -> bool:
        return self.index is not None

    @property
    def done(self) -> bool:
        return self.reader.done

    @property
    def failed(self) -> bool:
        return self.reader.failed

    @property
    def first_key(self) -> str | None:
        return self.reader.keys[0] if self.reader.keys else None

    def feed(self, text: str, delta: ParseDelta) -> int:
        """Consume text; returns how much of it belongs to the object (all of it unless the
        object ended or failed inside it)."""
        values = self.reader.feed(text)
        used = len(text)
        if self.reader.done or self.reader.failed:
            used = self.reader.end_offset
        self.raw.append(text[:used])
        for value in values:
            if value.key == "name" and self.index is None:
                self._name_text.append(value.text)
                if value.complete:
                    self._open(delta)
            elif value.key in ARGUMENT_KEYS and self._args_key in (None, value.key):
                self._args_key = value.key
                if value.kind is ValueKind.STRING:
                    self._string_args.append(value.text)
                    if value.complete:
                        self._arguments(delta, _decode_string("".join(self._string_args)))
                else:
                    self._arguments(delta, value.text)
        if self.reader.done:
            if self.index is None:
                self.reader.fail()  # a call needs a name
            elif self._args_key is None:
                self._stream._emit_arguments(delta, self.index, "{}")
        return used

    def finish(self, delta: ParseDelta) -> None:
        """The text ended inside the object: a committed call keeps what it has."""
        if self.index is not None and self._args_key is None:
            self._stream._emit_arguments(delta, self.index, "{}")

    def _open(self, delta: ParseDelta) -> None:
        try:
            name = json.loads("".join(self._name_text))
        except ValueError:
            name = None
        if not isinstance(name, str) or not name:
            self.reader.fail()
            return
        self.index = self._stream._open_call(delta, name)
        if self._held:
            self._stream._emit_arguments(delta, self.index, "".join(self._held))
            self._held = []

    def _arguments(self, delta: ParseDelta, text: str) -> None:
        if self.index is None:
            self._held.append(text)
        else:
            self._stream._emit_arguments(delta, self.index, text)


def _decode_string(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, str) else raw
