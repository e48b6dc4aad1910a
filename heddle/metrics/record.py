"""One record per request: every report is computed from these.

Token times are kept compactly. Every token a step samples gets that step's end time, so the
engine keeps one time per step (a `TokenTimeline`) and a request's tokens are runs of step
indices into it (`TokenTimes`): a request that decodes every step is one run of two integers,
whatever its length. Reports read `token_times` / `itls` as lists of floats (exact, built on
demand), and `summarize` counts inter-token gaps per step without building them.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy


class TokenTimeline:
    """The end time of each step, in order: index k is the k-th time appended.

    `trim` drops a prefix no live record refers to any more (a long-running server), so
    indices stay absolute: times[k - base].
    """

    __slots__ = ("base", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.base = 0

    def __len__(self) -> int:
        return self.base + len(self.times)

    def append(self, t: float) -> int:
        """Record a step's end time; returns its index."""
        self.times.append(t)
        return self.base + len(self.times) - 1

    def __getitem__(self, index: int) -> float:
        return self.times[index - self.base]

    def trim(self, keep_from: int) -> None:
        """Forget the times before index `keep_from`."""
        drop = keep_from - self.base
        if drop > 0:
            del self.times[:drop]
            self.base = keep_from


class TokenTimes(Sequence[float]):
    """The times of one request's tokens: runs of consecutive step indices into a timeline.

    `runs` holds (first index, last index) pairs, flattened: a request decoding every step is
    one run, extended in place (`runs[-1] = index`, the scheduler's per-token work). A step
    that yields several tokens of one request (speculative decoding) adds one-step runs, one
    per extra token. `detach()` copies the times out of the shared timeline (which may then be
    trimmed); times given explicitly (`of`) are kept as they are.
    """

    __slots__ = ("_own", "_timeline", "runs")

    def __init__(self, timeline: TokenTimeline | None = None) -> None:
        self._timeline = timeline
        self.runs = array("q")
        self._own: array[float] | None = None if timeline is not None else array("d")

    @classmethod
    def of(cls, times: Iterable[float]) -> TokenTimes:
        """Token times given explicitly (a load client's measurements, a loaded record)."""
        out = cls()
        assert out._own is not None
        out._own.extend(times)
        return out

    def add(self, index: int) -> None:
        """One token at step `index` of the timeline."""
        if self._own is not None:
            raise ValueError("these token times are not on a timeline: use add_time")
        runs = self.runs
        if runs and runs[-1] == index - 1:
            runs[-1] = index
        else:
            runs.append(index)
            runs.append(index)

    def add_time(self, t: float) -> None:
        """One token at time `t` (token times kept without a timeline)."""
        if self._own is None:
            self.detach()
        assert self._own is not None
        self._own.append(t)

    def detach(self) -> None:
        """Copy the times out of the shared timeline."""
        if self._own is None:
            self._own = array("d", self._iter_timeline())
            self._timeline = None
            self.runs = array("q")

    @property
    def timeline(self) -> TokenTimeline | None:
        return self._timeline

    @property
    def first_index(self) -> int | None:
        """The timeline index of the first token (None: no token, or detached)."""
        return self.runs[0] if self.runs and self._own is None else None

    def iter_runs(self) -> Iterator[tuple[int, int]]:
        """(first, last) step index of each run (on a timeline)."""
        runs = self.runs
        for i in range(0, len(runs), 2):
            yield runs[i], runs[i + 1]

    def _iter_timeline(self) -> Iterator[float]:
        timeline = self._timeline
        if timeline is None:
            return
        times, base = timeline.times, timeline.base
        for first, last in self.iter_runs():
            yield from times[first - base : last - base + 1]

    def __iter__(self) -> Iterator[float]:
        if self._own is not None:
            return iter(self._own)
        return self._iter_timeline()

    def __len__(self) -> int:
        if self._own is not None:
            return len(self._own)
        runs = self.runs
        if len(runs) == 2:  # the usual record: one run
            return runs[1] - runs[0] + 1
        return sum(runs[1::2]) - sum(runs[::2]) + len(runs) // 2  # sum of (last - first + 1)

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> list[float]: ...
    def __getitem__(self, index: int | slice) -> float | list[float]:
        if isinstance(index, slice):
            return list(self)[index]
        if self._own is not None:
            return self._own[index]
        timeline = self._timeline
        assert timeline is not None
        runs = self.runs
        if runs and index in (0, -1):
            return timeline[runs[0] if index == 0 else runs[-1]]
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenTimes | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"TokenTimes({list(self)!r})"


@dataclass(slots=True)
class RequestRecord:
    """Timing of one request, in the engine clock's seconds (wall or virtual)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    request_class: str = "default"
    user: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: TokenTimes = field(default_factory=TokenTimes)  # one per output token
    finish_time: float | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    # Time the request was ready to run (arrived, not finished) but not in a step.
    stall_time: float = 0.0
    # The part of stall_time spent while a longer request (more context) ran in its place.
    blocked_by_longer_time: float = 0.0
    num_steps: int = 0  # steps the request took part in
    # Sum over those steps of (tokens the step computed / its token budget): lock-step waste
    # shows as steps that ran far below their budget.
    step_utilization_sum: float = 0.0
    # Per-request SLO targets (seconds); they override a report's global SLO.
    ttft_slo: float | None = None
    tpot_slo: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.token_times, TokenTimes):
            self.token_times = TokenTimes.of(self.token_times)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def last_token_time(self) -> float | None:
        times = self.token_times
        return times[-1] if len(times) else None

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def step_utilization(self) -> float | None:
        """Mean utilization of the steps the request took part in."""
        return self.step_utilization_sum / self.num_steps if self.num_steps else None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        times = self.token_times
        num_tokens = len(times)
        if num_tokens < 2:
            return None
        return (times[-1] - times[0]) / (num_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies."""
        return [b - a for a, b in itertools.pairwise(self.token_times)]


def itl_counts(records: Iterable[RequestRecord]) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Every inter-token latency of `records`, as columns (values, counts): a value may repeat.

    Within a run of consecutive steps the gaps are the timeline's own step-to-step gaps, so
    they are counted per timeline step (a difference array over the runs, summed by numpy)
    instead of being listed token by token; gaps between runs, and records off a timeline, are
    listed with a count of 1. Each gap is the same float subtraction either way.
    """
    listed: list[float] = []
    per_timeline: dict[int, tuple[TokenTimeline, array[int]]] = {}
    for record in records:
        times = record.token_times
        timeline = getattr(times, "timeline", None)  # a plain list: listed
        if timeline is None:
            listed.extend(record.itls)
            continue
        entry = per_timeline.get(id(timeline))
        if entry is None:
            entry = (timeline, array("q", bytes(8 * (len(timeline) + 1))))
            per_timeline[id(timeline)] = entry
        _, diff = entry
        previous_last: int | None = None
        for first, last in times.iter_runs():
            if previous_last is not None:
                listed.append(timeline[first] - timeline[previous_last])
            if last > first:  # gaps (first, first+1) .. (last-1, last)
                diff[first + 1] += 1
                diff[last + 1] -= 1
            previous_last = last
    values = [numpy.array(listed, dtype=numpy.float64)]
    counts = [numpy.ones(len(listed), dtype=numpy.int64)]
    for timeline, diff in per_timeline.values():
        # Copies (tobytes), not views: a view would stop the engine appending to the timeline.
        steps = numpy.frombuffer(timeline.times.tobytes(), dtype=numpy.float64)
        base = timeline.base
        per_step = numpy.cumsum(numpy.frombuffer(diff.tobytes(), dtype=numpy.int64)[base + 1 :])
        num_gaps = min(len(steps) - 1, len(per_step))
        values.append(steps[1 : num_gaps + 1] - steps[:num_gaps])  # step k's gap: t[k] - t[k-1]
        counts.append(per_step[:num_gaps])
    return numpy.concatenate(values), numpy.concatenate(counts)
