"""An incremental reader of one JSON object, fed text as the model writes it.

It reports the object's top-level keys and the raw text of their values as it arrives, so a
tool call's arguments can be streamed as exactly the characters the model wrote: the streamed
fragments always concatenate to the raw value, whatever the chunking (no re-serialization of a
partial parse, which is how vLLM's streaming parsers came to drop a closing brace).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

_WHITESPACE = " \t\n\r"


class _State(enum.Enum):
    START = enum.auto()  # before the opening brace
    KEY_OR_END = enum.auto()  # after "{" or ","
    KEY = enum.auto()  # inside a key string
    COLON = enum.auto()
    VALUE_START = enum.auto()
    VALUE = enum.auto()  # inside a value
    AFTER_VALUE = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class ValueKind(enum.Enum):
    CONTAINER = "container"  # an object or an array
    STRING = "string"
    SCALAR = "scalar"  # a number, true, false or null


@dataclass(slots=True)
class ValueText:
    """Raw text of a top-level value: `text` arrived in this feed; `complete` ends it."""

    key: str
    kind: ValueKind
    text: str
    complete: bool


class ObjectReader:
    """Reads one top-level JSON object incrementally; see `feed`."""

    __slots__ = (
        "_depth",
        "_escape",
        "_in_string",
        "_key_text",
        "_kind",
        "_state",
        "end_offset",
        "key",
        "keys",
    )

    def __init__(self) -> None:
        self._state = _State.START
        self._key_text: list[str] = []
        self._kind = ValueKind.SCALAR
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.key: str | None = None  # the key whose value is being read
        self.keys: list[str] = []  # keys seen so far, in order
        # Once done: the offset in the last chunk just past the "}"; once failed: the offset
        # of the character that could not continue the object.
        self.end_offset = -1

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.ERROR

    @property
    def started(self) -> bool:
        """The opening brace has been read."""
        return self._state not in (_State.START, _State.ERROR)

    def fail(self) -> None:
        """Give up on the object (its content is not what the caller wants)."""
        self._state = _State.ERROR

    def feed(self, chunk: str) -> list[ValueText]:
        """Consume `chunk`; returns the value text read from it, in order.

        Stops at the closing brace of the object (`done`, `end_offset` tells where in `chunk`)
        or at the first character that cannot continue a JSON object (`failed`).
        """
        out: list[ValueText] = []
        value_start = -1  # where the current value's text begins in this chunk
        i = 0
        n = len(chunk)
        while i < n:
            state = self._state
            c = chunk[i]
            if state is _State.VALUE:
                end = self._scan_value(chunk, i)
                if end < 0:  # the value goes on past this chunk
                    start = value_start if value_start >= 0 else i
                    out.append(ValueText(self._current_key, self._kind, chunk[start:], False))
                    return out
                start = value_start if value_start >= 0 else i
                out.append(ValueText(self._current_key, self._kind, chunk[start:end], True))
                value_start = -1
                self._state = _State.AFTER_VALUE
                i = end
                continue
            if state is _State.KEY:
                j = self._scan_string(chunk, i)
                self._key_text.append(chunk[i : j if j >= 0 else n])
                if j < 0:
                    return out
                try:
                    key = json.loads("".join(self._key_text))
                except ValueError:
                    self._error(i)
                    return out
                self.key = key
                self.keys.append(key)
                self._key_text = []
                self._state = _State.COLON
                i = j
                continue
            if c in _WHITESPACE and state is not _State.DONE:
                i += 1
                continue
            if state is _State.START:
                if c == "{":
                    self._state = _State.KEY_OR_END
                else:
                    self._error(i)
            elif state is _State.KEY_OR_END:
                if c == '"':
                    self._key_text = ['"']
                    self._in_string = True
                    self._escape = False
                    self._state = _State.KEY
                elif c == "}":
                    self._finish(i)
                    return out
                else:
                    self._error(i)
            elif state is _State.COLON:
                if c == ":":
                    self._state = _State.VALUE_START
                else:
                    self._error(i)
            elif state is _State.VALUE_START:
                value_start = i
                self._begin_value(c)
                self._state = _State.VALUE
                if self._kind is not ValueKind.SCALAR:
                    i += 1  # the opening character is consumed here
                continue
            elif state is _State.AFTER_VALUE:
                if c == ",":
                    self._state = _State.KEY_OR_END
                elif c == "}":
                    self._finish(i)
                    return out
                else:
                    self._error(i)
            if self._state is _State.ERROR or self._state is _State.DONE:
                return out
            i += 1
        if value_start >= 0:  # a value opened on the chunk's last character
            out.append(ValueText(self._current_key, self._kind, chunk[value_start:], False))
        return out

    @property
    def _current_key(self) -> str:
        assert self.key is not None
        return self.key

    def _error(self, index: int) -> None:
        self._state = _State.ERROR
        self.end_offset = index

    def _finish(self, index: int) -> None:
        self._state = _State.DONE
        self.end_offset = index + 1

    def _begin_value(self, c: str) -> None:
        self._in_string = False
        self._escape = False
        if c in "{[":
            self._kind = ValueKind.CONTAINER
            self._depth = 1
        elif c == '"':
            self._kind = ValueKind.STRING
            self._in_string = True
        else:
            self._kind = ValueKind.SCALAR

    def _scan_string(self, chunk: str, i: int) -> int:
        """Inside a string: the offset just past its closing quote, or -1 if it goes on."""
        escape = self._escape
        n = len(chunk)
        while i < n:
            c = chunk[i]
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                self._escape = False
                self._in_string = False
                return i + 1
            i += 1
        self._escape = escape
        return -1

    def _scan_value(self, chunk: str, i: int) -> int:
        """The offset just past the current value, or -1 if it goes on past the chunk."""
        kind = self._kind
        if kind is ValueKind.STRING:
            return self._scan_string(chunk, i)
        n = len(chunk)
        if kind is ValueKind.SCALAR:
            while i < n:
                if chunk[i] in ",}" or chunk[i] in _WHITESPACE:
                    return i
                i += 1
            return -1
        depth = self._depth
        while i < n:
            if self._in_string:
                j = self._scan_string(chunk, i)
                if j < 0:
                    self._depth = depth
                    return -1
                i = j
                continue
            c = chunk[i]
            if c == '"':
                self._in_string = True
                self._escape = False
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self._depth = 0
                    return i + 1
            i += 1
        self._depth = depth
        return -1
