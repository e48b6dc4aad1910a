"""Which CPUs the engine core and the front end get.

The core's step is a team of OpenMP threads that wait for each other at every op; a thread
that loses its core to the front end stalls the whole team. So once there are cores to spare
the front end gets its own (one core up to 15, two from 16: HTTP, JSON, detokenization and SSE
for a few hundred streams fit in that) and the core's threads are pinned to the rest, one per
core. Below 4 cores, pinning would cost the core a quarter or more of its compute for a front
end that is idle most of a step, so nothing is pinned and the core runs one thread per core
(see docs/BENCHMARKS.md for what the 2-core box measured).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

MIN_CPUS_TO_PIN = 4
TWO_FRONTEND_CPUS_FROM = 16


@dataclass(frozen=True, slots=True)
class CpuPlan:
    frontend_cpus: tuple[int, ...] | None  # None: not pinned
    core_cpus: tuple[int, ...] | None
    core_threads: int

    def pin_this_process(self) -> None:
        """Pin the calling (front end) process, where the plan says so."""
        if self.frontend_cpus:
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setaffinity(0, self.frontend_cpus)


def available_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def plan_cpus(cpus: Sequence[int], num_threads: int | None = None) -> CpuPlan:
    """The plan for these CPUs; `num_threads` (the user's --num-threads) caps the core's team."""
    cpus = sorted(cpus)
    if len(cpus) < MIN_CPUS_TO_PIN:
        return CpuPlan(None, None, num_threads or len(cpus))
    num_frontend = 2 if len(cpus) >= TWO_FRONTEND_CPUS_FROM else 1
    frontend, core = tuple(cpus[:num_frontend]), tuple(cpus[num_frontend:])
    threads = min(num_threads, len(core)) if num_threads else len(core)
    return CpuPlan(frontend, core, threads)
