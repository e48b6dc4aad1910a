"""The scheduler's queues of waiting requests, kept in the policy's order when they can be.

A policy whose order key of a waiting request never changes while it waits (fcfs, priority,
lanes, oracle, ...) gets an `OrderedQueue`: the key is computed once when a request joins, and
the queue stays sorted, so a step reads its head without sorting or visiting the rest. Other
policies (keys that move with time or with the policy's own state: aging deadlines, fair
counters, a learning predictor) get an `ArrivalQueue` and sort it themselves each step.

Order keys end with the request's `seq`, so no two keys are equal: the order is the same
whichever queue holds the requests.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.request import Request

OrderKey = Callable[["Request"], tuple[float, ...]]


class ArrivalQueue:
    """Requests in the order they joined; O(1) join and leave."""

    ordered = False

    def __init__(self) -> None:
        self._items: dict[str, Request] = {}

    def add(self, request: Request, key: tuple[float, ...] | None = None) -> None:
        self._items[request.request_id] = request

    def remove(self, request: Request) -> None:
        del self._items[request.request_id]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, request: object) -> bool:
        return getattr(request, "request_id", None) in self._items


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


def insert_sorted(requests: list[Request], request: Request, key: OrderKey) -> None:
    """Put `request` into `requests` (sorted by order_key) at its place."""
    request.order_key = key(request)
    index = bisect.bisect_right(requests, request.order_key, key=_order_key)
    requests.insert(index, request)


def _order_key(request: Request) -> tuple[float, ...]:
    return request.order_key
