"""A replayed run's decision events and finished requests, held compactly.

A saved run of 100,000 requests holds about 500,000 decision events and 100,000 request rows;
as Python dicts they took most of the 963 MB a `heddle view` process used. Here they are
columns:
- `EventTable`: evictions (nearly every event of a busy run) as typed arrays (step, time,
  block count, kind, and the requests they went to as indices into one table of names); the
  rarer events (stalls, preemptions, recomputes, queue stops) as their compact JSON text, with
  their time beside it. The order of the two kinds is one byte per event.
- `RequestTable`: one float64 column per numeric field (None is NaN), the class and finish
  reason as small codes, the ids in one list with an index.
Both give back the same dicts the page reads (`event_to_dict`, `request_row`), built when read,
and answer the store's questions (a request's events, a window's markers, a CDF's values)
with numpy over the columns, without building every dict.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

_EVICT_KEYS = ("k", "step", "t", "blocks", "for", "kind")
_EVENT, _OTHER = 0, 1


class _Names:
    """Strings kept once each, by index."""

    __slots__ = ("index", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def code(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.names)
            self.names.append(name)
        return found


class EventTable:
    """A replay's decision events in the order they were logged (see the module docstring)."""

    def __init__(self) -> None:
        self._order = bytearray()  # per event: _EVENT (an eviction) or _OTHER
        self._names = _Names()  # request ids the evictions went to
        self._kinds = _Names()
        self._steps = array("q")
        self._times = array("d")
        self._blocks = array("q")
        self._kind = array("i")
        self._for_end = array("q")  # the end of each eviction's span of `_for`
        self._for = array("i")  # name codes
        self._other: list[bytes] = []  # the other events' JSON text
        self._other_time = array("d")  # their time ("t", or "t0"; NaN if none)
        self._other_marker = bytearray()  # 1: a preemption (a timeline marker)

    def __len__(self) -> int:
        return len(self._order)

    def append(self, event: dict[str, Any]) -> None:
        if (
            event.get("k") == "evict"
            and tuple(event) == _EVICT_KEYS
            and isinstance(event["for"], list)
        ):
            self._order.append(_EVENT)
            self._steps.append(int(event["step"]))
            self._times.append(float(event["t"]))
            self._blocks.append(int(event["blocks"]))
            self._kind.append(self._kinds.code(str(event["kind"])))
            code = self._names.code
            self._for.extend(code(str(name)) for name in event["for"])
            self._for_end.append(len(self._for))
            return
        self._order.append(_OTHER)
        self._other.append(json.dumps(event, separators=(",", ":")).encode())
        when = event.get("t", event.get("t0"))
        self._other_time.append(float("nan") if when is None else float(when))
        self._other_marker.append(1 if event.get("k") == "preempt" else 0)

    def extend(self, events: Any) -> None:
        for event in events:
            self.append(event)

    # -- reading ----------------------------------------------------------------------------
    def _eviction(self, i: int) -> dict[str, Any]:
        start = self._for_end[i - 1] if i else 0
        names = self._names.names
        return {
            "k": "evict",
            "step": self._steps[i],
            "t": self._times[i],
            "blocks": self._blocks[i],
            "for": [names[c] for c in self._for[start : self._for_end[i]]],
            "kind": self._kinds.names[self._kind[i]],
        }

    def _other_event(self, i: int) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self._other[i])
        return event

    def __iter__(self) -> Iterator[dict[str, Any]]:
        evictions = others = 0
        for kind in self._order:
            if kind == _EVENT:
                yield self._eviction(evictions)
                evictions += 1
            else:
                yield self._other_event(others)
                others += 1

    def _positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Each eviction's and each other event's position in the log."""
        order = np.frombuffer(bytes(self._order), dtype=np.uint8)
        return np.flatnonzero(order == _EVENT), np.flatnonzero(order == _OTHER)

    def _merged(self, evictions: np.ndarray, others: list[int]) -> list[dict[str, Any]]:
        """The given evictions and other events, in log order."""
        eviction_at, other_at = self._positions()
        found = [(int(eviction_at[i]), _EVENT, int(i)) for i in evictions]
        found += [(int(other_at[i]), _OTHER, i) for i in others]
        found.sort()
        return [
            self._eviction(i) if kind == _EVENT else self._other_event(i) for _, kind, i in found
        ]

    def naming(self, request_id: str) -> list[dict[str, Any]]:
        """The events that name `request_id` (as `store._names` decides), in log order."""
        evictions = np.empty(0, dtype=np.int64)
        code = self._names.index.get(request_id)
        if code is not None and len(self._for):
            hits = np.flatnonzero(np.frombuffer(self._for, dtype=np.int32) == code)
            ends = np.frombuffer(self._for_end, dtype=np.int64)
            evictions = np.unique(np.searchsorted(ends, hits, side="right"))
        needle = json.dumps(request_id).encode()  # as it appears in the JSON text
        others = []
        for i, text in enumerate(self._other):
            if needle in text:
                event = self._other_event(i)
                if event.get("id") == request_id or request_id in (
                    event.get("victim"),
                    event.get("for"),
                ):
                    others.append(i)
        return self._merged(evictions, others)

    def markers(self, lo: float, hi: float, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` preemptions and evictions with lo <= t <= hi, in log order."""
        times = np.frombuffer(self._times, dtype=np.float64)
        evictions = np.flatnonzero((times >= lo) & (times <= hi))
        other_times = np.frombuffer(self._other_time, dtype=np.float64)
        marker = np.frombuffer(bytes(self._other_marker), dtype=np.uint8) == 1
        others = np.flatnonzero(marker & (other_times >= lo) & (other_times <= hi))
        eviction_at, other_at = self._positions()
        positions = np.concatenate([eviction_at[evictions], other_at[others]])
        if len(positions) > limit:  # the newest: the largest positions
            keep = np.sort(positions)[-limit:]
            first = keep[0]
            evictions = evictions[eviction_at[evictions] >= first]
            others = others[other_at[others] >= first]
        return self._merged(evictions, [int(i) for i in others])

    def nbytes(self) -> int:
        """The bytes its columns and texts hold (not counting the name strings)."""
        arrays = (self._steps, self._times, self._blocks, self._kind, self._for_end, self._for)
        held = sum(a.buffer_info()[1] * a.itemsize for a in arrays)
        return held + len(self._order) + sum(len(t) for t in self._other)


# The fields of a request row (heddle.view.store.request_row), by how they are held.
_TEXT = ("cls", "reason")
_INTS = ("prompt", "output", "preemptions", "cached")
_FLOATS = (
    "arrival",
    "scheduled",
    "first_token",
    "finish",
    "ttft",
    "tpot",
    "e2e",
    "stall",
    "ttft_slo",
    "tpot_slo",
)
ROW_KEYS = (
    "id",
    "cls",
    "arrival",
    "scheduled",
    "first_token",
    "finish",
    "prompt",
    "output",
    "ttft",
    "tpot",
    "e2e",
    "stall",
    "preemptions",
    "cached",
    "reason",
    "ttft_slo",
    "tpot_slo",
)
_NONE = -1  # the code of a missing text field


class RequestTable:
    """Finished requests by id, columnar (see the module docstring). A mapping of id -> row
    for what the store does with rows (`get`, `values`, assignment, `len`, `in`)."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self._texts = {name: _Names() for name in _TEXT}
        self._codes = {name: array("i") for name in _TEXT}
        self._numbers = {name: array("d") for name in _INTS + _FLOATS}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._index

    def __setitem__(self, request_id: str, row: dict[str, Any]) -> None:
        unknown = set(row) - set(ROW_KEYS)
        if unknown:
            raise ValueError(f"a request row has fields the view does not know: {sorted(unknown)}")
        at = self._index.get(request_id)
        if at is None:
            at = self._index[request_id] = len(self._ids)
            self._ids.append(request_id)
            for column in self._codes.values():
                column.append(_NONE)
            for numbers in self._numbers.values():
                numbers.append(float("nan"))
        for name in _TEXT:
            value = row.get(name)
            self._codes[name][at] = _NONE if value is None else self._texts[name].code(value)
        for name, numbers in self._numbers.items():
            value = row.get(name)
            numbers[at] = float("nan") if value is None else float(value)

    def _row(self, at: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for key in ROW_KEYS:
            if key == "id":
                row[key] = self._ids[at]
            elif key in self._codes:
                code = self._codes[key][at]
                row[key] = None if code == _NONE else self._texts[key].names[code]
            else:
                value = self._numbers[key][at]
                if value != value:  # NaN: None
                    row[key] = None
                else:
                    row[key] = int(value) if key in _INTS else value
        return row

    def get(self, request_id: str) -> dict[str, Any] | None:
        at = self._index.get(request_id)
        return None if at is None else self._row(at)

    def values(self) -> Iterator[dict[str, Any]]:
        return (self._row(at) for at in range(len(self._ids)))

    def rows(self, indices: Any) -> list[dict[str, Any]]:
        return [self._row(int(at)) for at in indices]

    def column(self, name: str) -> np.ndarray:
        """A numeric field as float64 (NaN: None), a view of the table's own column."""
        return np.frombuffer(self._numbers[name], dtype=np.float64)

    def codes(self, name: str) -> tuple[np.ndarray, list[str]]:
        """A text field: its codes (-1: None) and the strings they index."""
        return np.frombuffer(self._codes[name], dtype=np.int32), self._texts[name].names

    def classes(self) -> list[str]:
        codes, names = self.codes("cls")
        return sorted(names[c] for c in np.unique(codes) if c != _NONE)

    def nbytes(self) -> int:
        codes = sum(c.buffer_info()[1] * c.itemsize for c in self._codes.values())
        return codes + sum(c.buffer_info()[1] * c.itemsize for c in self._numbers.values())
