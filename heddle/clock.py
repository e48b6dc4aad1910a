"""Time is injected: the real engine reads a wall clock, the simulator a virtual one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary origin; monotone."""
        ...

    def wait_until(self, t: float) -> None:
        """Let time pass until `t`: a wall clock sleeps, a virtual clock jumps."""
        ...


class WallClock:
    """Monotonic wall time in seconds."""

    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """A clock that only moves when told to: the simulator advances it over step ends and events."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds}s")
        self._now += seconds

    def wait_until(self, t: float) -> None:
        if t > self._now:
            self._now = t

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"cannot move a clock back from {self._now} to {t}")
        self._now = t
