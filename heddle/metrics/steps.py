"""One record per engine step: what ran, how long it took, and how full the KV cache was."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload


@dataclass(slots=True)
class StepStat:
    step_id: int
    start_time: float
    duration: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    # The requests in the step, in order: kept only when the engine is asked to
    # (record_step_requests), as they cost memory per request per step.
    request_ids: list[str] = field(default_factory=list)
    token_budget: int = 0
    num_requests: int = 0  # requests in the step (len(request_ids) when those are kept)

    def __post_init__(self) -> None:
        if not self.num_requests:
            self.num_requests = len(self.request_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def utilization(self) -> float:
        """Tokens computed / token budget."""
        return self.num_tokens / self.token_budget if self.token_budget else 0.0


# Counts are C ints (4 bytes: a step id past 2**31 would take 2**31 steps), times doubles.
_COLUMNS = (
    ("step_id", "i"),
    ("start_time", "d"),
    ("duration", "d"),
    ("num_prefill_tokens", "i"),
    ("num_decode_tokens", "i"),
    ("num_running", "i"),
    ("num_waiting", "i"),
    ("kv_blocks_used", "i"),
    ("kv_blocks_total", "i"),
    ("token_budget", "i"),
    ("num_requests", "i"),
)


class StepLog(Sequence[StepStat]):
    """The engine's steps in columns (one typed array per field): 52 bytes a step instead of
    a StepStat object's ~300, which matters at millions of steps. Reads as a list of StepStat
    (each built when read); `column(name)` gives a field's array without building any."""

    def __init__(self, steps: Iterable[StepStat] = ()) -> None:
        self._columns = {name: array(code) for name, code in _COLUMNS}
        # Per step, its request ids (None: not kept); a list only once one step keeps them.
        self._request_ids: list[list[str]] | None = None
        self._appenders: tuple[Callable[[Any], None], ...] = tuple(
            self._columns[name].append for name, _ in _COLUMNS
        )
        for step in steps:
            self.append(step)

    def record(
        self,
        step_id: int,
        start_time: float,
        duration: float,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        num_running: int,
        num_waiting: int,
        kv_blocks_used: int,
        kv_blocks_total: int,
        token_budget: int,
        num_requests: int,
        request_ids: list[str] | None = None,
    ) -> None:
        """Append one step (the fields of StepStat, in its order but `request_ids` last)."""
        # Once per engine step: the eleven appends written out (no tuple, no zip).
        a = self._appenders
        a[0](step_id)
        a[1](start_time)
        a[2](duration)
        a[3](num_prefill_tokens)
        a[4](num_decode_tokens)
        a[5](num_running)
        a[6](num_waiting)
        a[7](kv_blocks_used)
        a[8](kv_blocks_total)
        a[9](token_budget)
        a[10](num_requests)
        if request_ids:
            if self._request_ids is None:
                self._request_ids = [[] for _ in range(len(self) - 1)]
            self._request_ids.append(request_ids)
        elif self._request_ids is not None:
            self._request_ids.append([])

    def append(self, step: StepStat) -> None:
        self.record(
            step.step_id,
            step.start_time,
            step.duration,
            step.num_prefill_tokens,
            step.num_decode_tokens,
            step.num_running,
            step.num_waiting,
            step.kv_blocks_used,
            step.kv_blocks_total,
            step.token_budget,
            step.num_requests,
            step.request_ids,
        )

    def column(self, name: str) -> array[Any]:
        """One field of every step (read-only by convention)."""
        return self._columns[name]

    def clear(self) -> None:
        for column in self._columns.values():
            del column[:]
        self._request_ids = None

    def __len__(self) -> int:
        return len(self._columns["step_id"])

    def _step(self, index: int) -> StepStat:
        c = self._columns
        ids = self._request_ids
        return StepStat(
            step_id=c["step_id"][index],
            start_time=c["start_time"][index],
            duration=c["duration"][index],
            num_prefill_tokens=c["num_prefill_tokens"][index],
            num_decode_tokens=c["num_decode_tokens"][index],
            num_running=c["num_running"][index],
            num_waiting=c["num_waiting"][index],
            kv_blocks_used=c["kv_blocks_used"][index],
            kv_blocks_total=c["kv_blocks_total"][index],
            request_ids=list(ids[index]) if ids is not None else [],
            token_budget=c["token_budget"][index],
            num_requests=c["num_requests"][index],
        )

    @overload
    def __getitem__(self, index: int) -> StepStat: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepStat]: ...

    def __getitem__(self, index: int | slice) -> StepStat | list[StepStat]:
        if isinstance(index, slice):
            return [self._step(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("step index out of range")
        return self._step(index)

    def __iter__(self) -> Iterator[StepStat]:
        for index in range(len(self)):
            yield self._step(index)
