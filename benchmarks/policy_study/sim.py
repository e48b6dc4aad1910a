"""The simulator side of the policy study.

Each point is one seeded run of the real Engine, Scheduler and policy on a virtual clock with a
roofline cost model; points are independent, so they run in worker processes.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.sim.roofline import kv_cache_blocks
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.sim.specs import load_model_spec

from .metrics import run_metrics, saturation_throughput
from .spec import SIM_WORKLOADS, policy_options


@dataclass(frozen=True)
class SimSetup:
    """The simulated machine and engine: the defaults of `heddle simulate`."""

    model: str = "llama-3.1-8b"
    hardware: str = "h100"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16

    def num_blocks(self) -> int:
        """The KV pool: what fits on the device with this setup's seats (the same pool for a
        variant with more seats)."""
        return _num_blocks(self)

    def describe(self) -> str:
        return (
            f"simulated {self.hardware.upper()}, {self.model} roofline; token budget "
            f"{self.max_num_batched_tokens}, {self.max_num_seqs} seats, block {self.block_size}"
        )


@cache
def _num_blocks(setup: SimSetup) -> int:
    return kv_cache_blocks(
        setup.model,
        setup.hardware,
        setup.block_size,
        tp=load_model_spec(setup.model).default_tp,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_num_seqs=setup.max_num_seqs,
    )


@dataclass(frozen=True)
class Point:
    """One run: a workload at `rate` req/s under one policy."""

    workload: str
    policy: str
    load: float  # fraction of fcfs saturation; 0 for capacity probes
    rate: float
    seed: int
    num_requests: int
    options: tuple[tuple[str, Any], ...] = ()  # extra policy options (tuning studies)
    tag: str = ""  # names a variant: "" for the main sweep
    max_num_seqs: int | None = None  # None: the setup's


def simulate_point(point: Point, setup: SimSetup, probe: bool = False) -> dict[str, Any]:
    """Run one point. A probe (an overloading rate) reports the policy's saturation
    throughput; any other point reports `run_metrics`."""
    spec = SIM_WORKLOADS[point.workload]
    workload = spec.make(point.seed, point.rate, point.num_requests)
    options = {**policy_options(point.policy, spec), **dict(point.options)}
    config = EngineConfig(
        cache=CacheConfig(block_size=setup.block_size),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=setup.max_num_batched_tokens,
            max_num_seqs=point.max_num_seqs or setup.max_num_seqs,
            policy=point.policy,
            policy_options=options,
        ),
        seed=point.seed,
    )
    engine = build_sim_engine(
        config, model=setup.model, hardware=setup.hardware, num_blocks=setup.num_blocks()
    )
    result = simulate(workload, engine)
    out: dict[str, Any] = {
        "point": asdict(point),
        "options": options,
        "virtual_seconds": result.elapsed,
        "wall_seconds": result.wall_seconds,
        "num_rejected": len(result.rejected),
    }
    policy = result.engine.scheduler.policy if result.engine is not None else None
    if probe:
        mean_output = sum(r.output_len for r in workload.requests) / len(workload.requests)
        out["saturation"] = saturation_throughput(result.records, result.step_stats, mean_output)
    else:
        out["metrics"] = run_metrics(result.records, result.step_stats, spec.short_classes, policy)
    return out


def _run(job: tuple[Point, SimSetup, bool]) -> dict[str, Any]:
    return simulate_point(*job)


def cache_key(point: dict[str, Any], options: dict[str, Any]) -> str:
    """A point and the policy options it ran with: results are reused only when both match."""
    return json.dumps([point, options], sort_keys=True)


def key_of(point: Point) -> str:
    options = {**policy_options(point.policy, SIM_WORKLOADS[point.workload]), **dict(point.options)}
    return cache_key(asdict(point), options)


def run_points(
    points: Iterable[Point],
    setup: SimSetup,
    jobs: int,
    probe: bool = False,
    cache: dict[str, dict[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every point not in `cache` (in `jobs` processes); results in the order given."""
    log = log or functools.partial(print, flush=True)
    points = list(points)
    cache = cache if cache is not None else {}
    todo = [p for p in points if key_of(p) not in cache]
    work = [(p, setup, probe) for p in todo]
    started = time.perf_counter()
    if jobs <= 1 or len(work) <= 1:
        iterator: Iterable[dict[str, Any]] = map(_run, work)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        iterator = pool.imap_unordered(_run, work)
    try:
        for i, result in enumerate(iterator, 1):
            cache[cache_key(result["point"], result["options"])] = result
            p = result["point"]
            log(
                f"[{i}/{len(work)} {time.perf_counter() - started:5.0f}s] {p['workload']:<12} "
                f"{p['policy']:<8} {p['tag'] or ''} load {p['load']:.2f} seed {p['seed']}: "
                f"{result['wall_seconds']:.1f}s wall"
            )
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return [cache[key_of(p)] for p in points]
