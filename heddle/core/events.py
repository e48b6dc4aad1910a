"""Decision events: why each ready request was not in a step, who was preempted for whom, which
cached KV was evicted, and what a preempted request had to recompute. A bounded ring buffer,
cheap enough to leave on.

The scheduler calls a few verbs at the points where it decides (`begin_step`, `skip`,
`stop_queue`, `scheduled`, `preempted`, `evicted`, `finished`, `end_step`); its accounting
(heddle/core/accounting.py) calls `opened` and `closed` where a request's idle period starts and
ends, so a stall interval spans exactly the steps whose time the accounting charges it. Nothing
here visits every waiting request every step:

- A scheduling loop visits requests in the policy's order and stops somewhere (token budget
  spent, no seat, out of blocks). Every request it did not reach waits *behind* that stop, for
  that reason: one call, `stop_queue(queue, reason)`, explains them all. A request the loop did
  reach and passed over (admission held by the policy, lane cap, parent not ready, preempted)
  is explained on its own with `skip(request, reason)`.
- Stall time is charged with cumulative counters: per queue and reason, the seconds charged to
  "whoever waits behind the stop" so far. A request's stall interval opens with a copy of its
  queue's counters and closes (when it runs again, or finishes) with the difference, plus the
  corrections of the steps where it was explained on its own. Opening and closing cost one copy
  of a small tuple; a step costs one addition per queue.

So a closed `StallInterval` says how many seconds of that wait each reason explains, and the
sum over a request's intervals equals the stall time the engine charged it.

What is kept is kept as plain tuples of strings and numbers (the ring's events, the open
intervals): the garbage collector stops tracking such tuples after its first pass, so a full
ring costs the collector nothing. With dataclasses in the ring, the collector's passes over
tens of thousands of live events were most of what the events cost a simulation. Readers get
the dataclasses below (`events_since`, iteration), built when they read.

Evictions are the one kind of event a busy pool makes on most steps, several times a step, so
they are recorded flat: the KV pool appends each evicted block's id to `evicted_blocks` and the
id of the request it went to, one entry per block, to `evicted_for` (no call into the log, no
object per allocation). Both are plain lists: a list append is one specialised instruction of
the interpreter, where an `array` append is a method call that parses its argument (an int into
a 'd' array also goes through a float conversion); the ids are objects the pool holds anyway,
so a list entry costs 8 bytes like an array's. A step that evicted appends three numbers to
three more plain lists (its step, its time, and where its span of those lists ends), inline in
`end_step`, no container object: a kept tuple per step made the garbage collector run more
often, and its full passes are what a long run pays; ints and floats are not objects it
tracks (the step and the time are objects the log holds anyway); typed arrays took about
twice as long per append (timeit). The order of evictions among the other events costs the
eviction nothing: each of the rarer other events notes how many evictions came before it.
The lists are a bounded detail ring of their own (`detail_capacity` blocks, the older half
dropped when they hold twice that); an `Eviction` is built from them when it is read, and
one whose detail has been dropped keeps its count and loses its block and request ids.
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.core.accounting import StallReason
from heddle.request import RequestStatus

if TYPE_CHECKING:
    from heddle.request import Request

DEFAULT_CAPACITY = 65_536


__all__ = ["StallReason"]  # the accounting's reasons, re-exported: the events split by them

REASONS: tuple[StallReason, ...] = tuple(StallReason)
_INDEX = {reason: i for i, reason in enumerate(REASONS)}
_VALUES: tuple[str, ...] = tuple(reason.value for reason in REASONS)
_NUM = len(REASONS)
_ZERO = (0.0,) * _NUM


class Queue(enum.IntEnum):
    RUNNING = 0  # holds blocks, was not served this step
    WAITING = 1  # holds no blocks


_QUEUE_NAMES = ("running", "waiting")


@dataclass(frozen=True, slots=True)
class StallInterval:
    """One wait of one request, from the step it was first left out of to the one it ran in
    (or finished at). `seconds` splits the charged time by reason."""

    request_id: str
    request_class: str
    queue: str  # "running" or "waiting"
    start_step: int
    end_step: int  # the step it ran in again (or the last step before it finished)
    start_time: float
    end_time: float
    seconds: dict[str, float]  # reason value -> seconds charged; only reasons that apply

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def main_reason(self) -> str | None:
        return max(self.seconds, key=self.seconds.__getitem__) if self.seconds else None


@dataclass(frozen=True, slots=True)
class Preemption:
    """`victim` lost its KV blocks (it will recompute) to make room for `beneficiary`."""

    step_id: int
    time: float
    victim_id: str
    victim_class: str
    beneficiary_id: str | None  # None: the victim itself could not grow and gave way
    reason: str  # "out_of_blocks" (someone needed blocks) or "no_seat" (someone needed a seat)


@dataclass(frozen=True, slots=True)
class Eviction:
    """Free blocks holding cached (or parked) KV were handed out again in a step: their
    content is gone. One event per step (a busy pool evicts on most block allocations)."""

    step_id: int
    time: float
    num_blocks: int
    for_request_ids: tuple[str, ...]  # the requests whose allocations took them
    kind: str = "cached"  # "cached" prefix blocks; later "parked" session KV
    block_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueStop:
    """From this step on, the requests a scheduling loop did not reach wait for `reason`
    (None: the loop reached every request). Logged only when it changes."""

    step_id: int
    time: float
    queue: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class Recompute:
    """A preempted request ran again and computed once more the KV it had lost: from
    `start_time` (its first step back) to `end_time` (when it had again all it had computed
    before; None: it finished or was preempted again first). Of its blocks that were in the
    prefix cache when it was preempted, `num_evicted_blocks` were evicted while it waited, at
    the steps `evicted_at_steps`, by allocations for `evicted_for`: the evictions that made it
    recompute what the cache would otherwise have given back."""

    request_id: str
    request_class: str
    preempted_step: int
    start_step: int
    start_time: float
    end_step: int | None
    end_time: float | None
    num_tokens: int  # tokens it had computed before the preemption
    num_cached: int  # of those, found in the prefix cache when it came back
    num_cached_blocks: int  # its blocks in the prefix cache when it was preempted
    num_evicted_blocks: int  # of those, evicted before it came back
    evicted_at_steps: tuple[int, ...]
    evicted_for: tuple[str, ...]

    @property
    def num_recomputed(self) -> int:
        return max(0, self.num_tokens - self.num_cached)


Event = StallInterval | Preemption | Eviction | QueueStop | Recompute

# The ring holds (kind, *fields) tuples of plain values; kind indexes _TYPES.
_STALL, _PREEMPT, _EVICT, _STOP, _RECOMPUTE = range(5)
_TYPES: tuple[Any, ...] = (StallInterval, Preemption, Eviction, QueueStop, Recompute)


class _Waiting:
    """A preempted request until it is back: what it had, and which of its blocks were cached."""

    __slots__ = ("cached_blocks", "evicted_from", "evictions_from", "num_computed", "step")

    def __init__(
        self,
        step: int,
        num_computed: int,
        cached_blocks: frozenset[int],
        evictions_from: int,
        evicted_from: int,
    ):
        self.step = step
        self.num_computed = num_computed
        self.cached_blocks = cached_blocks
        self.evictions_from = evictions_from  # the log's eviction-event count then
        self.evicted_from = evicted_from  # the log's evicted-block count then


class DecisionLog:
    """The ring buffer of the last `capacity` events, and the stall attribution behind it.

    Owned by one scheduler and called from its thread only. Readers take `events_since(n)`
    with the `num_events` they saw last; older events fall off the ring. `cached_blocks_of`
    (set by the scheduler) names a request's blocks that are in the prefix cache.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, detail_capacity: int | None = None):
        if capacity < 1:
            raise ValueError("a decision log needs room for at least one event")
        if detail_capacity is not None and detail_capacity < 1:
            raise ValueError("a decision log needs room for at least one evicted block")
        self.capacity = capacity
        # Evicted blocks whose ids (and requests) are kept: between this and twice this.
        self.detail_capacity = (
            max(8 * capacity, 1024) if detail_capacity is None else detail_capacity
        )
        # The events but evictions, as tuples; evictions in a flat array (below). Beside each
        # ring event, how many evictions were logged before it: the order of the two streams
        # (its last `len(_ring)` entries are the ring's; the older half goes at twice that).
        self._ring: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._ring_after: array[int] = array("q")
        self._num_ring = 0  # ring events appended since the start
        # Cumulative seconds charged, per queue and reason, to whoever waits behind a stop.
        self._charged = ([0.0] * _NUM, [0.0] * _NUM)
        # The counters as a tuple, shared by the waits opened while they stay the same (None:
        # they moved since): a wait opens without a copy, and one that closes with the same
        # tuple saw no counter move.
        self._snapshots: list[tuple[float, ...] | None] = [None, None]
        # request id -> (queue, counters when it opened, start step, start time, class)
        self._open: dict[str, tuple[int, tuple[float, ...], int, float, str]] = {}
        self._adjust: dict[str, list[float]] = {}  # corrections of requests explained alone
        self._stops: list[int | None] = [None, None]  # this step's stop reason per queue
        self._last_stops: list[int | None] = [None, None]
        # Whether `_stops` (this step's) or `_last_stops` hold a reason: one test per step when
        # nothing stopped (most steps).
        self._stop_set = self._last_set = False
        self._skipped: list[tuple[str, int, int]] = []  # (id, queue, reason) explained alone
        self.step_id = 0
        self.now = 0.0
        self._in_step = self._began = False
        self.num_preemptions = 0
        # The eviction detail: per evicted block, its id and the request it went to (appended
        # by the KV pool and cache manager); `_evicted_base` blocks were dropped before them.
        self.evicted_blocks: list[int] = []
        self.evicted_for: list[str] = []
        self._evicted_base = 0
        self._evicted_logged = 0  # of the lists, the entries already in an eviction event
        # Eviction events, three numbers each: step, time, and the end of their span of the
        # detail (an absolute position; the span starts where the previous one ended, the
        # first held one at `_evictions_start`). `_evictions_base` events were dropped first.
        self._eviction_steps: list[int] = []
        self._eviction_times: list[float] = []
        self._eviction_ends: list[int] = []
        self._evictions_base = 0
        self._evictions_start = 0
        # Past these lengths the older halves go (one comparison each per evicting step).
        self._rows_limit = 2 * capacity
        self._detail_limit = 2 * self.detail_capacity
        self.cached_blocks_of: Callable[[Request], Sequence[int]] | None = None
        self._preempted: dict[str, _Waiting] = {}  # preempted, not yet back
        # Back and recomputing: request -> (waiting info, start step, start time, num cached,
        # evicted blocks, eviction steps, evicted for)
        self._recomputing: dict[str, tuple[Request, _Waiting, int, float, int, Any]] = {}
        self._last_end = 0.0  # when the last step ended

    # -- reading ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return min(self.capacity, len(self._ring) + len(self._eviction_steps))

    @property
    def num_events(self) -> int:
        """Events appended since the start (readers get the last `capacity`)."""
        return self._num_ring + self._num_evictions

    @property
    def _num_evictions(self) -> int:
        return self._evictions_base + len(self._eviction_steps)

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted since the start."""
        return self._evicted_base + len(self.evicted_blocks)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._tail(self.capacity))

    def _tail(self, count: int) -> list[Event]:
        """The newest `count` events (at most `capacity`), oldest first."""
        count = min(count, len(self))
        ring, after = self._ring, self._ring_after
        raw = len(ring) - 1
        offset = len(after) - len(ring)  # the ring's entries in `after`
        eviction = len(self._eviction_steps) - 1  # index into the held rows
        base = self._evictions_base
        out: list[Event] = []
        for _ in range(count):  # newest first: a ring event after eviction e has after > e
            if raw >= 0 and (eviction < 0 or after[offset + raw] > base + eviction):
                out.append(self._event(ring[raw]))
                raw -= 1
            else:
                out.append(self._eviction(eviction))
                eviction -= 1
        out.reverse()
        return out

    def _eviction_span(self, index: int) -> tuple[int, int]:
        """The [start, end) of held eviction row `index` in the detail (absolute)."""
        ends = self._eviction_ends
        return (ends[index - 1] if index else self._evictions_start), ends[index]

    def _eviction(self, index: int) -> Eviction:
        step, now = self._eviction_steps[index], self._eviction_times[index]
        start, end = self._eviction_span(index)
        lo, hi = start - self._evicted_base, end - self._evicted_base
        if lo < 0:  # its detail fell off the detail ring
            return Eviction(step, now, end - start, ())
        whom = tuple(dict.fromkeys(self.evicted_for[lo:hi]))
        return Eviction(step, now, end - start, whom, "cached", tuple(self.evicted_blocks[lo:hi]))

    def _event(self, raw: tuple[Any, ...]) -> Event:
        kind = raw[0]
        if kind == _STALL:
            _, rid, cls, queue, s0, s1, t0, t1, seconds = raw
            return StallInterval(rid, cls, queue, s0, s1, t0, t1, dict(seconds))
        event: Event = _TYPES[kind](*raw[1:])
        return event

    def events_since(self, seen: int) -> list[Event]:
        """The events appended after the first `seen` (at most the last `capacity`)."""
        new = self.num_events - seen
        return self._tail(new) if new > 0 else []

    def is_stalled(self, request_id: str) -> bool:
        return request_id in self._open

    def _append(self, raw: tuple[Any, ...]) -> None:
        self._ring.append(raw)
        after = self._ring_after
        after.append(self._num_evictions)
        if len(after) > 2 * self.capacity:
            del after[: self.capacity]
        self._num_ring += 1

    # -- the scheduler's verbs --------------------------------------------------------------
    def begin_step(self, step_id: int, now: float) -> None:
        if len(self.evicted_blocks) != self._evicted_logged:  # evicted between steps
            self._log_evictions()
        if self._recomputing:
            self._check_recomputes()
        self.step_id = step_id
        self.now = now
        self._in_step = self._began = True
        if self._stop_set:  # the last step (perhaps an empty one, never ended) stopped a loop
            self._stops[0] = self._stops[1] = None
            self._stop_set = False
        if self._skipped:
            self._skipped.clear()

    def opened(self, request: Request, reason: StallReason) -> None:
        """The accounting's `on_idle`: `request` is idle from now (it arrived, or was left out
        of this step, or preempted: the preemption itself is explained by `preempted`)."""
        request_id = request.request_id
        if request_id in self._open:
            return
        if not self._in_step and reason is StallReason.QUEUED:
            # An arrival, between steps (most calls): `_start` inline; the next step is the
            # first it could be in.
            snapshot = self._snapshots[Queue.WAITING]
            if snapshot is None:
                snapshot = self._snapshots[Queue.WAITING] = tuple(self._charged[Queue.WAITING])
            now = self.now
            arrival = request.arrival_time
            self._open[request_id] = (
                Queue.WAITING,
                snapshot,
                self.step_id + 1 if self._began else self.step_id,
                arrival if arrival > now else now,
                request.request_class,
            )
            return
        running = request.status is RequestStatus.RUNNING and reason is not StallReason.PREEMPTED
        queue = Queue.RUNNING if running else Queue.WAITING
        if self._in_step:
            self._start(request, queue)
        else:  # between steps (an arrival): the next step is the first it could be in
            step = self.step_id + 1 if self._began else self.step_id
            self._start(request, queue, step, max(self.now, request.arrival_time))
        if reason is StallReason.PREEMPTED:
            self._skipped.append((request.request_id, queue, _INDEX[reason]))

    def closed(self, request: Request) -> None:
        """The accounting's `on_busy`: `request` is in this step (or has finished)."""
        entry = self._open.get(request.request_id)
        # No counter moved since it opened and it was never explained on its own: no wait to
        # explain (most requests at a load the engine keeps up with), `_close` without a call.
        if entry is not None and (
            entry[1] is not self._snapshots[entry[0]]
            or (self._adjust and request.request_id in self._adjust)
        ):
            self._close(request.request_id)
        elif entry is not None:
            del self._open[request.request_id]

    def stop_queue(self, queue: Queue, reason: StallReason) -> None:
        """The loop over `queue` stopped: every request it did not reach waits for `reason`.

        A loop that stops twice keeps its first reason."""
        if self._stops[queue] is None:
            self._stops[queue] = _INDEX[reason]
            self._stop_set = True

    def skip(self, request: Request, reason: StallReason) -> None:
        """The loop reached `request` and left it out of this step, for `reason`."""
        entry = self._open.get(request.request_id)
        queue = Queue.RUNNING if entry is None else entry[0]
        if entry is None:  # a running request left out: its stall starts now
            self._start(request, Queue.RUNNING)
        self._skipped.append((request.request_id, queue, _INDEX[reason]))

    def scheduled(self, request: Request) -> None:
        """A waiting request was admitted into this step (its wait is closed by `closed`); a
        preempted one starts its recompute."""
        if self._preempted and request.request_id in self._preempted:
            self._resumed(request)

    def preempted(self, victim: Request, beneficiary: Request | None, reason: StallReason) -> None:
        """`victim` loses its blocks this step for `beneficiary` (None: for its own growth).
        Called before its blocks are freed."""
        self.num_preemptions += 1
        victim_id = victim.request_id
        self._append(
            (
                _PREEMPT,
                self.step_id,
                self.now,
                victim_id,
                victim.request_class,
                None if beneficiary is None else beneficiary.request_id,
                reason.value,
            )
        )
        if victim_id in self._recomputing:
            self._end_recompute(victim_id, done=False)
        if victim.num_computed_tokens:
            cached = self.cached_blocks_of(victim) if self.cached_blocks_of else ()
            self._preempted[victim_id] = _Waiting(
                self.step_id,
                victim.num_computed_tokens,
                frozenset(cached),
                self._num_evictions,
                self.num_evicted_blocks,
            )
        if victim_id in self._open:
            # It was already left out (running): that wait ends, one in the waiting queue
            # starts. A busy victim's wait is opened by the accounting (`opened`).
            self._close(victim_id)
            self._start(victim, Queue.WAITING)
            self._skipped.append((victim_id, Queue.WAITING, _INDEX[StallReason.PREEMPTED]))

    def evicted(self, request_id: str, block_ids: Sequence[int]) -> None:
        """Allocating for `request_id` reused `block_ids`, blocks that held cached KV (logged
        as one event at the end of the step). The KV cache manager writes the two lists itself
        (`KVCacheManager.events`); this is the same for any other caller."""
        self.evicted_blocks.extend(block_ids)
        self.evicted_for += (request_id,) * len(block_ids)

    def _log_evictions(self) -> None:
        """One eviction event for the blocks evicted since the last: three numbers appended to
        three flat lists (no object, no call into the log from the pool: a busy pool evicts on
        most steps). `end_step` does the same inline."""
        num_blocks = len(self.evicted_blocks)
        self._eviction_steps.append(self.step_id)
        self._eviction_times.append(self.now)
        self._eviction_ends.append(self._evicted_base + num_blocks)
        self._evicted_logged = num_blocks
        if num_blocks > self._detail_limit or len(self._eviction_steps) > self._rows_limit:
            self._trim_evictions()

    def _trim_evictions(self) -> None:
        """Drop the older half of the eviction rows and of the detail once either holds twice
        what readers get."""
        if len(self._eviction_steps) > self._rows_limit:  # readers get the last `capacity`
            drop = self.capacity
            self._evictions_start = self._eviction_ends[drop - 1]
            del self._eviction_steps[:drop]
            del self._eviction_times[:drop]
            del self._eviction_ends[:drop]
            self._evictions_base += drop
        blocks = self.evicted_blocks
        if len(blocks) > self._detail_limit:
            drop = len(blocks) - self.detail_capacity
            del blocks[:drop]
            del self.evicted_for[:drop]
            self._evicted_base += drop
            self._evicted_logged = len(blocks)

    def finished(self, request: Request) -> None:
        """The request left (finished, aborted): a recompute it was in ends unfinished."""
        request_id = request.request_id
        if self._recomputing and request_id in self._recomputing:
            self._end_recompute(request_id, done=False)
        if self._preempted:
            self._preempted.pop(request_id, None)

    def end_step(self, charged: float) -> None:
        """The step ran; `charged` seconds go to every request that was not in it (as the
        engine's stall accounting charges them)."""
        self._in_step = False
        self._last_end = self.now + charged
        num_blocks = len(self.evicted_blocks)
        if num_blocks != self._evicted_logged:  # `_log_evictions`, inline: most steps evict
            steps = self._eviction_steps
            steps.append(self.step_id)
            self._eviction_times.append(self.now)
            self._eviction_ends.append(self._evicted_base + num_blocks)
            self._evicted_logged = num_blocks
            if num_blocks > self._detail_limit or len(steps) > self._rows_limit:
                self._trim_evictions()
        # Nothing stopped this step nor the last: no counter moves, no event (most steps).
        if self._stop_set or self._last_set:
            stops, last = self._stops, self._last_stops
            for queue in (0, 1):
                stop = stops[queue]
                if stop is not None:
                    self._charged[queue][stop] += charged
                    self._snapshots[queue] = None
                if stop != last[queue]:
                    last[queue] = stop
                    value = None if stop is None else _VALUES[stop]
                    self._append((_STOP, self.step_id, self.now, _QUEUE_NAMES[queue], value))
            self._last_set = last[0] is not None or last[1] is not None
        if not self._skipped:
            return
        stops = self._stops
        for request_id, queue, index in self._skipped:
            if request_id not in self._open:
                continue  # its wait ended in this step (it finished)
            adjust = self._adjust.get(request_id)
            if adjust is None:
                adjust = self._adjust[request_id] = [0.0] * _NUM
            adjust[index] += charged
            # The counters charged this step to whoever waited behind the stop: not to it.
            behind = stops[queue]
            if behind is not None:
                adjust[behind] -= charged
        self._skipped.clear()

    # -- intervals --------------------------------------------------------------------------
    def _start(
        self, request: Request, queue: Queue, step: int | None = None, now: float | None = None
    ) -> None:
        snapshot = self._snapshots[queue]
        if snapshot is None:  # the counters moved since the last wait opened here
            snapshot = self._snapshots[queue] = tuple(self._charged[queue])
        self._open[request.request_id] = (
            queue,
            snapshot,
            self.step_id if step is None else step,
            self.now if now is None else now,
            request.request_class,
        )

    def _close(self, request_id: str) -> None:
        queue, snapshot, start_step, start_time, request_class = self._open.pop(request_id)
        charged = self._charged[queue]
        adjust = self._adjust.pop(request_id, None) if self._adjust else None
        if adjust is None:
            if snapshot is self._snapshots[queue]:
                return  # no counter moved since it opened: no wait to explain
            seconds = [
                (name, now - then)
                for name, now, then in zip(_VALUES, charged, snapshot, strict=True)
                if now - then > 1e-12
            ]
        else:
            seconds = [
                (name, now - then + extra)
                for name, now, then, extra in zip(_VALUES, charged, snapshot, adjust, strict=True)
                if now - then + extra > 1e-12
            ]
        if not seconds:
            return  # admitted at the first step it could have run in: no wait to explain
        self._append(
            (
                _STALL,
                request_id,
                request_class,
                _QUEUE_NAMES[queue],
                start_step,
                self.step_id,
                start_time,
                self.now,
                tuple(seconds),
            )
        )

    # -- recomputes -------------------------------------------------------------------------
    def _resumed(self, request: Request) -> None:
        """A preempted request is back (its prefix-cache hits already counted): which of its
        cached blocks were evicted while it waited, and by whom."""
        waited = self._preempted.pop(request.request_id)
        lost: set[int] = set()
        steps: list[int] = []
        for_ids: list[str] = []
        cached = waited.cached_blocks
        base = self._evicted_base
        start = waited.evicted_from - base
        if cached and len(self.evicted_blocks) > start:
            blocks, owners = self.evicted_blocks, self.evicted_for
            # The blocks evicted since it was preempted (what the detail still holds), with
            # the step of each: logged ones from the eviction events, the rest now.
            hits = [i for i in range(max(start, 0), len(blocks)) if blocks[i] in cached]
            if hits:
                first = max(waited.evictions_from - self._evictions_base, 0)
                steps_of = self._eviction_steps
                spans = []
                for j in range(first, len(steps_of)):
                    lo, hi = self._eviction_span(j)
                    spans.append((lo - base, hi - base, steps_of[j]))
                spans.append((self._evicted_logged, len(blocks), self.step_id))
                span = 0
                for i in hits:
                    lost.add(blocks[i])
                    if i < spans[0][0]:
                        continue  # its step's event fell off the ring: when is not known
                    while spans[span][1] <= i:
                        span += 1
                    step = spans[span][2]
                    if not steps or steps[-1] != step:
                        steps.append(step)
                    for_ids.append(owners[i])
        evicted = (len(lost), tuple(steps), tuple(dict.fromkeys(for_ids)))
        self._recomputing[request.request_id] = (
            request,
            waited,
            self.step_id,
            self.now,
            request.num_computed_tokens,
            evicted,
        )
        if request.num_computed_tokens >= waited.num_computed:
            self._end_recompute(request.request_id, done=True, at_start=True)

    def _check_recomputes(self) -> None:
        """Before a step: the requests that have again all the KV they had are done."""
        done = [
            request_id
            for request_id, (request, waited, *_) in self._recomputing.items()
            if request.num_computed_tokens >= waited.num_computed
        ]
        for request_id in done:
            self._end_recompute(request_id, done=True)

    def _end_recompute(self, request_id: str, *, done: bool, at_start: bool = False) -> None:
        request, waited, start_step, start_time, num_cached, evicted = self._recomputing.pop(
            request_id
        )
        if not done:
            end_step, end_time = None, None
        elif at_start:
            end_step, end_time = start_step, start_time
        else:
            end_step, end_time = self.step_id, self._last_end  # the step that caught it up
        self._append(
            (
                _RECOMPUTE,
                request_id,
                request.request_class,
                waited.step,
                start_step,
                start_time,
                end_step,
                end_time,
                waited.num_computed,
                num_cached,
                len(waited.cached_blocks),
                *evicted,
            )
        )
