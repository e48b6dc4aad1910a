"""The per-machine cache of `--quantization auto`'s kernel plan.

Timing kernels at load is noisy: two processes on one machine (the in-process engine and an
engine core in its own process, or two servers) could pick different kernels near a crossover
and then return different logprobs for the same request. So the plan `tune_dispatch` measures
is written once per machine and read by every later process: a JSON file under the cache
directory, named by a hash of everything the timings depend on: the CPU (model name and its
full flags line), the torch version, the number of torch threads, the compute dtype, the
layer shapes and kernels of each kind, the row counts tried and the tuning rule. A process that
finds its key's file applies it without timing anything; one that does not times, writes the
file atomically, and holds a lock meanwhile so that processes starting at once wait for the
first one's plan instead of timing their own. A plan timed on a busy machine (one path's rounds
spread by more than NOISY_SPREAD of their median, an outlier at each end not counted) is cached
all the same, with its spread and the machine's load average, and a warning says to time it
again on a quiet machine (`--retune-kernels`): the same kernels in every process come first.
Such a plan is not kept for ever: the first process that finds it while the machine is quiet
(1-minute load average under QUIET_LOAD per CPU) times it again and replaces it, once. A plan
written before the load was recorded counts as busy. A plan timed on a quiet machine is final
until `--retune-kernels`.

Cache directory: $HEDDLE_TUNING_CACHE, else $XDG_CACHE_HOME/heddle/tuning (~/.cache/...).
`ModelConfig.retune_kernels` (`--retune-kernels`) times again and overwrites the file.
`python -m heddle.model.tuning_cache` prints the cached plans.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from heddle.model.device import cpu_identity
from heddle.model.linear_plan import (
    NOISY_SPREAD,
    TUNE_RULE,
    DispatchLinear,
    apply_plan,
    describe_plan,
    dispatch_groups,
    kernel_name,
    tune_dispatch,
)

logger = logging.getLogger(__name__)

PLAN_FORMAT = 1
# A cached plan timed on a busy machine is timed again by the first process that starts while
# the 1-minute load average is under this share of the CPUs (a test run or a second server
# keeps the load above it, so processes that run side by side still share one plan).
QUIET_LOAD = 0.25
# A plan whose tuning saw a load average of at least this share of the CPUs counts as busy.
BUSY_LOAD = 1.0


def machine_load() -> float:
    """The 1-minute load average per CPU (0.0 where the OS does not report it)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def timed_busy(data: dict[str, object]) -> bool:
    """Whether a cached plan's timings came from a busy machine: spread rounds, a high load
    average, or no record of the load at all (a plan from before it was kept)."""
    spread = data.get("spread")
    load = data.get("load_per_cpu")
    if not isinstance(load, (int, float)):
        return True
    return (isinstance(spread, (int, float)) and spread > NOISY_SPREAD) or load >= BUSY_LOAD


@dataclass(frozen=True, slots=True)
class KindShape:
    """What a kind's timings depend on: its kernel, layer shape and how many layers it has."""

    kind: str
    kernel: str  # "int4" / "int8"
    in_features: int
    out_features: int
    num_layers: int


def plan_dispatch(layers: list[DispatchLinear], dtype: torch.dtype, retune: bool = False,
                  clock: Callable[[], float] = time.perf_counter,
                  load: Callable[[], float] = machine_load) -> str:
    """Set every two-path layer's row-count threshold from this machine's cached plan, or time
    them (tune_dispatch) and cache the plan. Returns the one-line description of the plan."""
    groups = dispatch_groups(layers)
    if not groups:
        return "no layer has two kernels"
    kernels = {kind: kernel_name(group[0]) for kind, group in groups.items()}
    shapes = [KindShape(kind, kernels[kind], group[0].in_features, group[0].out_features,
                        len(group)) for kind, group in groups.items()]
    key = plan_key(shapes, dtype, TUNE_RULE)
    path = plan_path(key)
    with plan_lock(path):
        cached = None if retune else read_plan(path, key)
        if cached is not None and timed_busy(cached) and load() < QUIET_LOAD:
            logger.info("quantization auto: the cached kernel plan %s was timed on a busy "
                        "machine and this one is quiet: timing it again", path)
            cached = None
        if cached is not None:
            stored = cached["plan"]
            assert isinstance(stored, dict)
            plan = {kind: int(stored[kind]) for kind in groups}  # the layers' order
            apply_plan(layers, plan)
            description = describe_plan(plan, kernels)
            logger.info("quantization auto: kernel plan from %s: %s", path, description)
            return description
        load_before = load()
        choices = tune_dispatch(layers, clock=clock)
        load_seen = max(load_before, load())
        plan = {c.kind: c.max_rows for c in choices}
        description = describe_plan(plan, kernels)
        timings = {c.kind: {str(rows): list(t) for rows, t in c.timings_us.items()}
                   for c in choices}
        spread = max(c.spread for c in choices)
        if spread > NOISY_SPREAD:
            # Cached all the same: every process on the machine must run the same kernels (a
            # plan per process would bring back the disagreement this cache exists to end).
            logger.warning("quantization auto: kernel timings were noisy (spread %.0f%% > %.0f%%:"
                           " a busy machine?); the plan is cached anyway, rerun with "
                           "--retune-kernels on a quiet machine to time it again", 100 * spread,
                           100 * NOISY_SPREAD)
        try:
            write_plan(path, key, plan, timings, description, spread, load_seen)
        except OSError as e:  # a read-only cache: the plan still holds for this process
            logger.warning("could not cache the kernel plan at %s: %s", path, e)
        logger.info("quantization auto: tuned kernel plan (cached at %s): %s", path, description)
        return description


def cache_dir() -> Path:
    override = os.environ.get("HEDDLE_TUNING_CACHE")
    if override:
        return Path(override)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "heddle" / "tuning"


def plan_key(shapes: list[KindShape], dtype: torch.dtype, rule: str) -> dict[str, object]:
    """Everything a plan's timings depend on (hashed into the file name, stored in the file)."""
    return {
        "format": PLAN_FORMAT,
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "kinds": [[s.kind, s.kernel, s.in_features, s.out_features, s.num_layers]
                  for s in shapes],
        "rule": rule,
    }


def plan_path(key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"plan-{digest}.json"


def read_plan(path: Path, key: dict[str, object]) -> dict[str, object] | None:
    """The cached plan at `path` if it is readable and was made for exactly `key`."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    plan = data.get("plan")
    kinds = [entry[0] for entry in key["kinds"]]  # type: ignore[attr-defined]
    if not isinstance(plan, dict) or sorted(plan) != sorted(kinds) or not all(
        isinstance(v, int) and v >= 0 for v in plan.values()
    ):
        return None
    return data


def write_plan(path: Path, key: dict[str, object], plan: dict[str, int],
               timings: dict[str, dict[str, list[float]]], description: str,
               spread: float = 0.0, load_per_cpu: float = 0.0) -> None:
    """Write atomically (a reader sees the old file or the whole new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"key": key, "plan": plan, "description": description, "timings_us": timings,
            "spread": spread, "load_per_cpu": load_per_cpu}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        json.dump(body, f, indent=1, sort_keys=True)
        tmp = f.name
    os.replace(tmp, path)


@contextlib.contextmanager
def plan_lock(path: Path) -> Iterator[None]:
    """An exclusive lock beside the plan file, held while one process tunes."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (closed below)
    except OSError as e:  # no writable cache: tune unlocked, uncached
        logger.warning("kernel plan cache %s is not writable: %s", path.parent, e)
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def main() -> None:
    directory = cache_dir()
    plans = sorted(directory.glob("plan-*.json")) if directory.is_dir() else []
    if not plans:
        print(f"no tuned kernel plans in {directory}")
        return
    for path in plans:
        try:
            data = json.loads(path.read_text())
            key = data["key"]
            print(f"{path}: {key['dtype']}, {key['threads']} threads, torch {key['torch']}, "
                  f"timing spread {100 * data.get('spread', 0.0):.0f}%, "
                  f"{'busy' if timed_busy(data) else 'quiet'} machine: {data['description']}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{path}: unreadable ({e})", file=sys.stderr)


if __name__ == "__main__":
    main()
