"""The step series behind the view: one row per step, columnar, bounded, queried by window.

Every row is a bucket of `n` consecutive steps (1 while fresh). Counts (tokens, preemptions,
evicted blocks) are summed over a bucket; gauges (queue lengths, KV blocks, batch size, step
time) are summed too and divided by `n` when read, so a bucket shows their mean per step; step
time and batch size also keep their maximum. When a bounded series is full, its older half is
merged pairwise: old history gets coarser, recent steps stay exact, memory stays fixed.

A query returns at most `max_points` buckets over a time window (equal-time bins, computed with
numpy over the stored columns), so a page never holds more than that, however long the run.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Columns of every row (all float64; step ids are exact in a double up to 2**53).
_SUM = ("n", "dur", "batch", "preempted", "evicted", "kv_free", "kv_cached", "kv_parked")
_MAX = ("dur_max", "batch_max")
_KEEP_FIRST = ("t", "step_first")
_KEEP_LAST = ("step_last", "end")
GROUPS = ("prefill", "decode", "running", "waiting", "kv_used")
_INTEGER = frozenset({"n", "step_first", "step_last", "preempted", "evicted", "prefill", "decode"})


@dataclass(slots=True)
class StepRow:
    """What one step adds to the view (plain values; built on the engine side)."""

    step_id: int
    start: float  # seconds, on the run's clock
    duration: float
    batch: int
    prefill: Mapping[str, int]  # class -> prefill tokens computed in the step
    decode: Mapping[str, int]  # class -> decode tokens
    running: Mapping[str, int]  # queue key (class, or class/lane) -> running requests
    waiting: Mapping[str, int]
    kv_used: Mapping[str, float]  # class -> blocks in use
    kv_free: int
    kv_cached: int  # free blocks still holding cached prefix KV
    kv_parked: int = 0
    preempted: int = 0
    evicted: int = 0  # cached blocks evicted in the step
    extra: dict[str, Any] = field(default_factory=dict)

    def to_list(self) -> list[Any]:
        """A compact JSON row (see `StepRow.from_list`)."""
        return [
            self.step_id,
            round(self.start, 6),
            round(self.duration, 7),
            self.batch,
            dict(self.prefill),
            dict(self.decode),
            dict(self.running),
            dict(self.waiting),
            dict(self.kv_used),  # the probe rounds it (to 0.01 block) when it refreshes
            self.kv_free,
            self.kv_cached,
            self.kv_parked,
            self.preempted,
            self.evicted,
        ]

    @classmethod
    def from_list(cls, row: list[Any]) -> StepRow:
        return cls(*row)


class StepSeries:
    """Rows of steps, appended in time order; `capacity` rows at most (None: unbounded)."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 4:
            raise ValueError("a bounded step series needs room for at least 4 rows")
        self.capacity = capacity
        self._cols: dict[str, array[float]] = {
            name: array("d") for name in (*_SUM, *_MAX, *_KEEP_FIRST, *_KEEP_LAST)
        }
        self._groups: dict[str, dict[str, array[float]]] = {g: {} for g in GROUPS}
        self.num_steps = 0  # steps appended since the start (rows may hold several)
        self.kv_total = 0

    def __len__(self) -> int:
        return len(self._cols["t"])

    @property
    def keys(self) -> dict[str, list[str]]:
        return {g: sorted(cols) for g, cols in self._groups.items()}

    @property
    def start_time(self) -> float | None:
        t = self._cols["t"]
        return t[0] if t else None

    @property
    def end_time(self) -> float | None:
        end = self._cols["end"]
        return end[-1] if end else None

    def append(self, row: StepRow) -> None:
        cols = self._cols
        size = len(cols["t"])
        values = {
            "n": 1.0,
            "dur": row.duration,
            "batch": float(row.batch),
            "preempted": float(row.preempted),
            "evicted": float(row.evicted),
            "kv_free": float(row.kv_free),
            "kv_cached": float(row.kv_cached),
            "kv_parked": float(row.kv_parked),
            "dur_max": row.duration,
            "batch_max": float(row.batch),
            "t": row.start,
            "step_first": float(row.step_id),
            "step_last": float(row.step_id),
            "end": row.start + row.duration,
        }
        for name, value in values.items():
            cols[name].append(value)
        for group, data in (
            ("prefill", row.prefill),
            ("decode", row.decode),
            ("running", row.running),
            ("waiting", row.waiting),
            ("kv_used", row.kv_used),
        ):
            columns = self._groups[group]
            for key in data.keys() - columns.keys():
                columns[key] = array("d", bytes(8 * size))  # zeros for the rows before
            for key, column in columns.items():
                column.append(float(data.get(key, 0.0)))
        self.num_steps += 1
        used = round(sum(row.kv_used.values()))
        self.kv_total = row.kv_free + row.kv_cached + row.kv_parked + used
        if self.capacity is not None and len(cols["t"]) > self.capacity:
            self._merge_older_half()

    def extend(self, rows: Iterable[StepRow]) -> None:
        for row in rows:
            self.append(row)

    def _merge_older_half(self) -> None:
        """Merge rows [0, half) pairwise: the oldest history at half the resolution."""
        size = len(self._cols["t"])
        half = (size // 2) & ~1
        for name, column in self._all_columns():
            a = np.frombuffer(column, dtype=np.float64)
            old = a[:half].reshape(-1, 2)
            if name in _MAX:
                merged = old.max(axis=1)
            elif name in _KEEP_FIRST:
                merged = old[:, 0]
            elif name in _KEEP_LAST:
                merged = old[:, 1]
            else:
                merged = old.sum(axis=1)
            fresh = array("d", merged.tobytes())
            fresh.frombytes(a[half:].tobytes())
            self._replace(name, fresh)

    def _all_columns(self) -> list[tuple[str, array[float]]]:
        out = list(self._cols.items())
        for group, columns in self._groups.items():
            out.extend((f"{group}.{key}", column) for key, column in columns.items())
        return out

    def _replace(self, name: str, column: array[float]) -> None:
        group, _, key = name.partition(".")
        if key:
            self._groups[group][key] = column
        else:
            self._cols[name] = column

    # -- saving -----------------------------------------------------------------------------
    @staticmethod
    def _listed(name: str, column: array[float]) -> list[Any]:
        """A column as a JSON list (rounded to what a plot can show); `name` or its group."""
        a = np.frombuffer(column, dtype=np.float64)
        if name in _INTEGER:
            return a.astype(np.int64).tolist()
        return _rounded(a, 7 if name in ("dur", "dur_max", "end", "t") else 3)

    def to_dict(self) -> dict[str, Any]:
        """Every column, as JSON lists (rounded to what a plot can show)."""
        listed = self._listed
        return {
            "num_steps": self.num_steps,
            "kv_total": self.kv_total,
            "columns": {name: listed(name, column) for name, column in self._cols.items()},
            "groups": {
                group: {key: listed(group, column) for key, column in columns.items()}
                for group, columns in self._groups.items()
            },
        }

    def saved_columns(self) -> Iterator[tuple[str | None, str, list[Any]]]:
        """(group or None, name, values) of every column, one at a time (a saved view writes
        each on a line of its own, and `load_column` reads it back)."""
        for name, column in self._cols.items():
            yield None, name, self._listed(name, column)
        for group, columns in self._groups.items():
            for key, column in columns.items():
                yield group, key, self._listed(group, column)

    def load_column(self, group: str | None, name: str, values: list[Any]) -> None:
        """One column of a saved series (`finish_loading` checks they fit together)."""
        column = array("d", np.asarray(values, dtype=np.float64).tobytes())
        if group is None:
            if name not in self._cols:
                raise ValueError(f"the saved step series has an unknown column {name!r}")
            self._cols[name] = column
        elif group in self._groups:
            self._groups[group][str(name)] = column

    def finish_loading(self, num_steps: int | None, kv_total: int) -> None:
        size = len(self._cols["t"])
        for name, column in self._all_columns():
            if len(column) != size:
                raise ValueError(f"the saved step column {name} has the wrong length")
        self.num_steps = size if num_steps is None else int(num_steps)
        self.kv_total = int(kv_total)

    @classmethod
    def from_dict(cls, data: dict[str, Any], capacity: int | None = None) -> StepSeries:
        series = cls(capacity)
        columns = data["columns"]
        size = len(columns["t"])
        for name in series._cols:
            values = columns.get(name)
            if values is None or len(values) != size:
                raise ValueError(f"the saved step series has no full column {name!r}")
            series._cols[name] = array("d", np.asarray(values, dtype=np.float64).tobytes())
        for group, keyed in data.get("groups", {}).items():
            if group not in series._groups:
                continue
            for key, values in keyed.items():
                if len(values) != size:
                    raise ValueError(f"the saved step column {group}.{key} has the wrong length")
                column = array("d", np.asarray(values, dtype=np.float64).tobytes())
                series._groups[group][key] = column
        series.num_steps = int(data.get("num_steps", size))
        series.kv_total = int(data.get("kv_total", 0))
        return series

    # -- reading ----------------------------------------------------------------------------
    def window(
        self, start: float | None = None, end: float | None = None, max_points: int = 1500
    ) -> dict[str, Any]:
        """Buckets of the steps that start in [start, end], at most `max_points` of them.

        Returns columnar lists: `t` (bucket start), `n` (steps in it), per-step means of the
        gauges and token counts, maxima of step time and batch size, sums of preemptions and
        evicted blocks."""
        if max_points < 1:
            raise ValueError("max_points must be positive")
        t_all = np.frombuffer(self._cols["t"], dtype=np.float64)
        lo = 0 if start is None else int(np.searchsorted(t_all, start, side="left"))
        hi = len(t_all) if end is None else int(np.searchsorted(t_all, end, side="right"))
        out: dict[str, Any] = {"kv_total": self.kv_total, "num_steps_total": self.num_steps}
        if hi <= lo:
            out.update({name: [] for name in (*_SUM, *_MAX, *_KEEP_FIRST, *_KEEP_LAST)})
            out.update({g: {} for g in GROUPS})
            out["num_steps"] = 0
            return out
        t = t_all[lo:hi]
        t0, t1 = float(t[0]), float(t[-1])
        if hi - lo <= max_points:
            starts = np.arange(hi - lo)
        else:
            span = (t1 - t0) or 1.0
            bins = np.minimum(((t - t0) / span * max_points).astype(np.int64), max_points - 1)
            starts = np.flatnonzero(np.diff(bins, prepend=-1))

        def col(column: array[float]) -> np.ndarray:
            return np.frombuffer(column, dtype=np.float64)[lo:hi]

        def reduce(column: array[float], how: str) -> np.ndarray:
            values = col(column)
            if how == "max":
                return np.maximum.reduceat(values, starts)
            if how == "first":
                return values[starts]
            if how == "last":
                return values[np.append(starts[1:], len(values)) - 1]
            return np.add.reduceat(values, starts)

        cols = self._cols
        n = reduce(cols["n"], "sum")
        out["t"] = _rounded(reduce(cols["t"], "first"), 6)
        out["n"] = n.astype(np.int64).tolist()
        out["step_first"] = reduce(cols["step_first"], "first").astype(np.int64).tolist()
        out["step_last"] = reduce(cols["step_last"], "last").astype(np.int64).tolist()
        out["end"] = _rounded(reduce(cols["end"], "last"), 6)
        out["num_steps"] = int(n.sum())
        for name in ("dur", "batch", "kv_free", "kv_cached", "kv_parked"):
            out[name] = _rounded(reduce(cols[name], "sum") / n, 7 if name == "dur" else 2)
        for name in _MAX:
            out[name] = _rounded(reduce(cols[name], "max"), 7 if name == "dur_max" else 2)
        for name in ("preempted", "evicted"):
            out[name] = reduce(cols[name], "sum").astype(np.int64).tolist()
        for group, columns in self._groups.items():
            out[group] = {
                key: _rounded(reduce(column, "sum") / n, 2) for key, column in columns.items()
            }
        return out

    def scatter(self, max_points: int = 4000) -> dict[str, list[float]]:
        """(batch size, step time, tokens) of single steps, for the step-time picture; an even
        sample when there are more than `max_points`."""
        n = np.frombuffer(self._cols["n"], dtype=np.float64)
        single = np.flatnonzero(n == 1)
        if len(single) > max_points:
            single = single[np.linspace(0, len(single) - 1, max_points).astype(np.int64)]
        batch = np.frombuffer(self._cols["batch"], dtype=np.float64)[single]
        dur = np.frombuffer(self._cols["dur"], dtype=np.float64)[single]
        prefill = np.zeros(len(single))
        for column in self._groups["prefill"].values():
            prefill += np.frombuffer(column, dtype=np.float64)[single]
        return {
            "batch": batch.astype(np.int64).tolist(),
            "dur": _rounded(dur, 7),
            "prefill": prefill.astype(np.int64).tolist(),
        }


def _rounded(values: np.ndarray, digits: int) -> list[float]:
    return [float(v) for v in np.round(values, digits)]
