"""The scheduler's queues of waiting requests, kept in the policy's order when they can be.

A policy whose order key of a waiting request never changes while it waits (fcfs, priority,
lanes, oracle, ...) gets an `OrderedQueue`: the key is computed once when a request joins, and
the queue stays sorted, so a step reads its head without sorting or visiting the rest.

A policy whose keys do change, but only at times or events it can name, gets a `RankedQueue`:
sorted like an `OrderedQueue`, and a request is re-keyed only when its key may have moved: at
the time the policy says (`key_change_time`: an slo deadline that turns "lost", an mlfq
request due for promotion), when the policy says it moved one (`take_moved`), or all of them
when the policy's own state changed what every key means (`keys_epoch`: sjf's predictor learnt
from a finished request; then the whole queue is re-keyed, once, when its order is next read).

`GroupedQueue` keeps the requests of each group (fair's users) in arrival order, so a policy
that interleaves groups (fair) reads the heads of the groups instead of sorting everyone.
Policies whose keys may change at any step (plas) get an `ArrivalQueue` and sort it each step.

Every queue iterates in the order requests joined (what an `ArrivalQueue` does), except an
`OrderedQueue`, which iterates in key order; a `RankedQueue` gives its key order with
`in_order()`.

Order keys end with the request's `seq`, so no two keys are equal: the order is the same
whichever queue holds the requests.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from heddle.request import Request

OrderKey = Callable[["Request"], tuple[float, ...]]


class RankingPolicy(Protocol):
    """What a `RankedQueue` asks of its policy (heddle/core/policies/base.py has the defaults)."""

    keys_epoch: int

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]: ...

    def key_change_time(self, request: Request, now: float) -> float | None: ...

    def take_moved(self) -> list[str]: ...


class _Members:
    """What every waiting queue reads alike: its requests in the order they joined, by id."""

    _items: dict[str, Request]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, request: object) -> bool:
        return getattr(request, "request_id", None) in self._items


class ArrivalQueue(_Members):
    """Requests in the order they joined; O(1) join and leave."""

    ordered = False

    def __init__(self) -> None:
        self._items: dict[str, Request] = {}

    def add(self, request: Request, key: tuple[float, ...] | None = None) -> None:
        self._items[request.request_id] = request

    def remove(self, request: Request) -> None:
        del self._items[request.request_id]


class OrderedQueue:
    """Requests sorted by a key computed once, when they join; iteration is in key order.

    Join and leave are a binary search and a list insert or delete (a memmove of pointers):
    cheap next to a step even with 100,000 requests waiting.
    """

    ordered = True

    def __init__(self, key: OrderKey) -> None:
        self._key = key
        self._keys: list[tuple[float, ...]] = []
        self._items: list[Request] = []

    def add(self, request: Request, key: tuple[float, ...] | None = None) -> None:
        """Queue `request` at its place (`key`: its order key, if already computed)."""
        if key is None:
            key = self._key(request)
        request.order_key = key
        index = bisect.bisect_right(self._keys, key)
        self._keys.insert(index, key)
        self._items.insert(index, request)

    def remove(self, request: Request) -> None:
        index = bisect.bisect_left(self._keys, request.order_key)
        if index == len(self._items) or self._items[index] is not request:
            raise ValueError(f"request {request.request_id} is not in the queue")
        del self._keys[index]
        del self._items[index]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, request: object) -> bool:
        key = getattr(request, "order_key", None)
        if key is None:
            return False
        index = bisect.bisect_left(self._keys, key)
        return index < len(self._items) and self._items[index] is request

    def head(self, count: int) -> list[Request]:
        return self._items[:count]


class RankedQueue(_Members):
    """Waiting requests sorted by keys that change only when the policy can say so.

    The key of a request is computed when it joins and again only when it may have moved:
    - at its `key_change_time` (a min-heap of those times is kept; `refresh(now)` re-keys the
      ones due, at the start of every step, with that step's `now`);
    - when the policy names it in `take_moved()` (read by `refresh`);
    - every key, when the policy's `keys_epoch` changed: the queue is marked stale, requests
      joining meanwhile wait in a side list, and the next `in_order(now)` re-keys all.
    So between those events the order is that of `sort_key(request, now)` for any `now`, which
    is what sorting the whole queue at every step would give. Iteration (`__iter__`) is in the
    order requests joined, as an `ArrivalQueue`'s; `in_order` is in key order.
    """

    ordered = False

    def __init__(self, policy: RankingPolicy, now: Callable[[], float]) -> None:
        self._policy = policy
        self._now = now
        self._items: dict[str, Request] = {}  # in the order they joined
        self._keys: list[tuple[float, ...]] = []
        self._sorted: list[Request] = []
        self._unsorted: dict[str, Request] = {}  # joined while stale: keyed at the next in_order
        self._epoch = policy.keys_epoch
        # (time its key may change, seq, stamp, request); stale entries are skipped.
        self._due: list[tuple[float, int, int, Request]] = []
        self._stamps: dict[str, int] = {}
        self._next_stamp = 0

    # -- membership -------------------------------------------------------------------------
    def add(self, request: Request, key: tuple[float, ...] | None = None) -> None:
        self._items[request.request_id] = request
        if self._epoch != self._policy.keys_epoch:
            self._unsorted[request.request_id] = request
            return
        now = self._now()
        self._insert(request, self._policy.sort_key(request, now) if key is None else key, now)

    def remove(self, request: Request) -> None:
        del self._items[request.request_id]
        self._stamps.pop(request.request_id, None)
        if self._unsorted.pop(request.request_id, None) is not None:
            return
        self._delete(request)

    def _insert(self, request: Request, key: tuple[float, ...], now: float | None) -> None:
        """Put `request` at its place; `now`: watch for its next key change from then on."""
        request.order_key = key
        index = bisect.bisect_right(self._keys, key)
        self._keys.insert(index, key)
        self._sorted.insert(index, request)
        if now is not None:
            self._watch(request, now)

    def _delete(self, request: Request) -> None:
        index = bisect.bisect_left(self._keys, request.order_key)
        if index == len(self._sorted) or self._sorted[index] is not request:
            raise ValueError(f"request {request.request_id} is not in the queue")
        del self._keys[index]
        del self._sorted[index]

    def _watch(self, request: Request, now: float) -> None:
        stamp = self._next_stamp
        self._next_stamp += 1
        self._stamps[request.request_id] = stamp
        when = self._policy.key_change_time(request, now)
        if when is not None:
            heapq.heappush(self._due, (when, request.seq, stamp, request))

    # -- keeping the order ------------------------------------------------------------------
    def refresh(self, now: float) -> None:
        """Re-key the requests whose keys may have moved by `now` (call once per step)."""
        policy = self._policy
        moved = policy.take_moved()
        if self._epoch != policy.keys_epoch:
            return  # every key is recomputed at the next in_order
        items, stamps, due = self._items, self._stamps, self._due
        rekeyed: list[Request] = []
        for request_id in moved:
            request = items.get(request_id)
            if request is not None:
                self._delete(request)
                self._insert(request, policy.sort_key(request, now), None)
                rekeyed.append(request)
        later = []
        while due and due[0][0] <= now:
            entry = heapq.heappop(due)
            _, seq, stamp, request = entry
            if stamps.get(request.request_id) != stamp:
                continue  # it left, or was re-keyed since
            key = policy.sort_key(request, now)
            if key != request.order_key:
                self._delete(request)
                self._insert(request, key, None)
                rekeyed.append(request)
                continue
            # Unmoved (the policy's own test at `now` said no, or the time moved on).
            when_next = policy.key_change_time(request, now)
            if when_next is not None:
                later.append((when_next, seq, stamp, request))  # after the loop: no spinning
        for entry in later:
            heapq.heappush(due, entry)
        policy.take_moved()  # the moves these re-keys made: their keys are current
        for request in rekeyed:
            self._watch(request, now)

    def in_order(self, now: float) -> list[Request]:
        """The requests in key order (the keys as of `now`)."""
        policy = self._policy
        if self._epoch != policy.keys_epoch:
            self._epoch = policy.keys_epoch
            requests = self._sorted + list(self._unsorted.values())
            self._unsorted = {}
            self._due = []
            key = policy.sort_key
            for request in requests:
                request.order_key = key(request, now)
            requests.sort(key=_order_key)
            self._sorted = requests
            self._keys = [r.order_key for r in requests]
            policy.take_moved()
            for request in requests:
                self._watch(request, now)
        return self._sorted

    def check_integrity(self) -> None:
        keys = self._keys
        current = self._epoch == self._policy.keys_epoch
        if current and (keys != sorted(keys) or keys != [r.order_key for r in self._sorted]):
            raise AssertionError("the ranked waiting queue is out of order")
        members = {r.request_id for r in self._sorted} | self._unsorted.keys()
        if members != self._items.keys():
            raise AssertionError("the ranked waiting queue's order and members disagree")


class GroupedQueue(_Members):
    """Waiting requests in arrival order, and per group (a policy's `group_of`, e.g. the user)
    sorted by (arrival time, seq): a policy that serves groups in turn reads their heads."""

    ordered = False

    def __init__(self, group_of: Callable[[Request], str]) -> None:
        self._group_of = group_of
        self._items: dict[str, Request] = {}  # in the order they joined
        self._group: dict[str, str] = {}  # request id -> its group when it joined
        self.groups: dict[str, list[Request]] = {}  # group -> its requests, earliest first

    def add(self, request: Request, key: tuple[float, ...] | None = None) -> None:
        self._items[request.request_id] = request
        group = self._group[request.request_id] = self._group_of(request)
        members = self.groups.setdefault(group, [])
        if members and _arrival_key(members[-1]) > _arrival_key(request):
            bisect.insort_right(members, request, key=_arrival_key)
        else:
            members.append(request)

    def remove(self, request: Request) -> None:
        del self._items[request.request_id]
        group = self._group.pop(request.request_id)
        members = self.groups[group]
        index = bisect.bisect_left(members, _arrival_key(request), key=_arrival_key)
        if index == len(members) or members[index] is not request:
            raise ValueError(f"request {request.request_id} is not in the queue")
        del members[index]
        if not members:
            del self.groups[group]

    def check_integrity(self) -> None:
        count = 0
        for members in self.groups.values():
            keys = [_arrival_key(r) for r in members]
            if not members or keys != sorted(keys):
                raise AssertionError("a group of the waiting queue is empty or out of order")
            count += len(members)
        if count != len(self._items):
            raise AssertionError("the waiting queue's groups and members disagree")


WaitingQueue = ArrivalQueue | OrderedQueue | RankedQueue | GroupedQueue


def insert_sorted(requests: list[Request], request: Request, key: OrderKey) -> None:
    """Put `request` into `requests` (sorted by order_key) at its place."""
    request.order_key = key(request)
    index = bisect.bisect_right(requests, request.order_key, key=_order_key)
    requests.insert(index, request)


def _order_key(request: Request) -> tuple[float, ...]:
    return request.order_key


def _arrival_key(request: Request) -> tuple[float, int]:
    return (request.arrival_time, request.seq)
