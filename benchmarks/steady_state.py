"""Steady state and overload in the simulator (issue 16): the figures of docs/POLICIES.md
"Steady state and overload".

Every run is the real Engine, Scheduler and policy on a virtual clock over the roofline of
Llama-3.1-8B on one H100 (the defaults of `heddle simulate`: token budget 8192, 256 seats),
measured the steady-state way (heddle/metrics/steady.py): requests arriving in the first 20%
of the arrival span are warm-up and not counted, the window ends at the last arrival (the
drain is not counted), unfinished requests enter TTFT censored at the end of the run, and
`trend` is the slope of TTFT against arrival time (0: a steady state; >0: a queue that grows
for as long as the run lasts). Refused requests (admission control) count as offered, never
as good.

    # TTFT and throughput against the run's length, with and without the preemption guard
    # and the shedder (one workload, one load):
    python benchmarks/steady_state.py horizon --workload long-prompt --load 1.5 \
        --horizons 1000,3000,10000 --seeds 0,1,2 --jobs 2
    # Policies x loads x seeds at one length, with the shedder on and off:
    python benchmarks/steady_state.py study --workloads long-prompt,chat --loads 1,1.5,3 \
        --num-requests 3000 --seeds 0,1,2 --jobs 2

Each writes its rows to results/steady_state/<name>.json (reused by --resume) and prints a
markdown table: per (policy, variant, load/horizon) the mean over seeds with a 95% Student-t
interval and the range. Results are in virtual time and deterministic: the same command gives
the same numbers on any machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.metrics.steady import Refused, interval, window_report
from heddle.workloads import Workload, get_workload

RESULTS = Path("results/steady_state")


@dataclass(frozen=True)
class Spec:
    """A workload, its classes' SLOs (TTFT s, mean TPOT s) and fcfs's saturation (req/s)."""

    generator: str
    options: tuple[tuple[str, Any], ...]
    # (class, ttft, tpot, priority: lower is more urgent); "*" for the rest
    slos: tuple[tuple[str, float, float, int], ...]
    short: tuple[str, ...]  # the latency-sensitive classes
    saturation: float  # fcfs's requests/s when backlogged (docs/POLICIES.md, seed 0)


# The workloads and saturation throughputs of docs/POLICIES.md (same machine, same setup).
WORKLOADS: dict[str, Spec] = {
    "chat": Spec("chat", (), (("*", 0.5, 0.05, 0),), ("default",), 43.82),
    "long-prompt": Spec(
        "long-prompt-mix", (), (("short", 0.5, 0.05, 0), ("long", 2.0, 0.1, 1)), ("short",), 34.97
    ),
    "reasoning": Spec(
        "reasoning-mix",
        (("length_scale", 0.5),),
        (("short", 0.5, 0.05, 0), ("reasoning", 2.0, 0.1, 1)),
        ("short",),
        60.34,
    ),
    "multi-tenant": Spec(
        "multi-tenant", (), (("*", 0.5, 0.05, 0),), ("user-1", "user-2", "user-3"), 43.92
    ),
}

# Variants of the scheduler around a policy: the guard's bound and the admission controller.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},  # the preemption guard on (max_recompute_ratio 0.1), no shedder
    "no-guard": {"max_recompute_ratio": None},
    "shed": {"admission": "slo"},  # the guard and the SLO shedder
}


@dataclass(frozen=True)
class Point:
    workload: str
    policy: str
    variant: str
    load: float  # multiple of fcfs's saturation throughput
    num_requests: int
    seed: int

    @property
    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def make_workload(spec: Spec, seed: int, rate: float, num_requests: int) -> Workload:
    base = get_workload(
        spec.generator, seed=seed, num_requests=num_requests, rate=rate, **dict(spec.options)
    )
    slos = {cls: (ttft, tpot, priority) for cls, ttft, tpot, priority in spec.slos}
    requests = []
    for r in base.requests:
        ttft, tpot, priority = slos.get(r.request_class) or slos["*"]
        requests.append(replace(r, ttft_slo=ttft, tpot_slo=tpot, priority=priority))
    return Workload(base.name, base.params, base.seed, requests)


def _simulate(workload: Workload, scheduler: SchedulerConfig, seed: int) -> Any:
    """The one place that builds the simulated engine (the defaults of `heddle simulate`)."""
    from heddle.sim.simulator import build_sim_engine, simulate

    config = EngineConfig(cache=CacheConfig(block_size=16), scheduler=scheduler, seed=seed)
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    return simulate(workload, engine)


def run_point(point: Point) -> dict[str, Any]:
    spec = WORKLOADS[point.workload]
    rate = point.load * spec.saturation
    workload = make_workload(spec, point.seed, rate, point.num_requests)
    scheduler = SchedulerConfig(
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        policy=point.policy,
        **VARIANTS[point.variant],
    )
    started = time.perf_counter()
    result = _simulate(workload, scheduler, point.seed)
    wall = time.perf_counter() - started
    by_id = {r.request_id: r for r in workload.requests}
    refused = [
        Refused(
            rid,
            result.start_time + by_id[rid].arrival_time,
            by_id[rid].request_class,
            reason.split(":")[0],
        )
        for rid, reason in result.rejected
        if rid in by_id
    ]
    report = window_report(result.records, refused, classes=spec.short)
    short = report.classes["+".join(spec.short)]
    overall = report.overall
    engine = result.engine
    guard = engine.scheduler.preemption_guard.report() if engine is not None else {}
    admission = engine.scheduler.admission.report() if engine is not None else {}
    return {
        "point": asdict(point),
        "rate": rate,
        "wall_seconds": wall,
        "window": report.intervals,
        "virtual_seconds": result.elapsed,
        "short": _row(short),
        "overall": _row(overall),
        "num_preemptions": result.num_preemptions,
        "lost_tokens": guard.get("lost_tokens"),
        "computed_tokens": guard.get("computed_tokens"),
        "guard_refused": guard.get("refused"),
        "admission": admission,
    }


def _row(c: Any) -> dict[str, Any]:
    return {
        "offered": c.offered,
        "refused": c.refused,
        "completed": c.completed,
        "unfinished": c.unfinished,
        "goodput": c.goodput,
        "slo_attainment": c.slo_attainment,
        "request_throughput": c.request_throughput,
        "output_throughput": c.output_throughput,
        "total_token_throughput": c.total_token_throughput,
        "ttft_p50": c.ttft.p50,
        "ttft_p99": c.ttft.p99,
        "ttft_trend": c.ttft_trend,
        "preemptions": c.num_preemptions,
    }


# -- running ----------------------------------------------------------------------------------
def run_all(points: Sequence[Point], path: Path, jobs: int, resume: bool) -> list[dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if resume and path.exists():
        for row in json.loads(path.read_text())["rows"]:
            done[Point(**row["point"]).key] = row
    todo = [p for p in points if p.key not in done]
    started = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        rows = [done[p.key] for p in points if p.key in done]
        path.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))

    pool = multiprocessing.get_context("fork").Pool(jobs) if jobs > 1 and len(todo) > 1 else None
    iterator: Iterable[dict[str, Any]] = (
        pool.imap_unordered(run_point, todo) if pool is not None else map(run_point, todo)
    )
    try:
        for i, row in enumerate(iterator, 1):
            done[Point(**row["point"]).key] = row
            p = row["point"]
            print(
                f"[{i}/{len(todo)} {time.perf_counter() - started:5.0f}s] {p['workload']} "
                f"{p['policy']} {p['variant']} load {p['load']} n {p['num_requests']} "
                f"seed {p['seed']}: {row['wall_seconds']:.1f}s wall",
                file=sys.stderr,
                flush=True,
            )
            save()
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    save()
    return [done[p.key] for p in points]


def machine() -> str:
    flags = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(
            line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line
        )
        flags = model
    except (OSError, StopIteration):
        flags = platform.processor()
    return f"{flags}; {multiprocessing.cpu_count()} cores; Python {platform.python_version()}"


# -- tables -----------------------------------------------------------------------------------
COLUMNS = (
    ("short TTFT p50 (s)", "short", "ttft_p50", ".2f"),
    ("short TTFT p99 (s)", "short", "ttft_p99", ".2f"),
    ("short trend (s/s)", "short", "ttft_trend", ".3f"),
    ("short goodput (req/s)", "short", "goodput", ".1f"),
    ("goodput (req/s)", "overall", "goodput", ".1f"),
    ("tok/s", "overall", "total_token_throughput", ".0f"),
    ("refused", "overall", "refused", ".0f"),
    ("preempt", "overall", "preemptions", ".0f"),
)


def table(rows: Sequence[dict[str, Any]], by: str) -> str:
    """One line per (workload, policy, variant, `by`), the seeds summarized."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        p = row["point"]
        groups.setdefault((p["workload"], p["policy"], p["variant"], p[by]), []).append(row)
    header = ["workload", "policy", "variant", by.replace("_", " "), "seeds"]
    header += [c[0] for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (workload, policy, variant, value), members in groups.items():
        cells = [workload, policy, variant, f"{value:g}", str(len(members))]
        for _, part, name, fmt in COLUMNS:
            values = [m[part][name] for m in members if m[part][name] is not None]
            cells.append(interval(values).text(fmt) if values else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    h = sub.add_parser("horizon", help="metrics against the run's length")
    h.add_argument("--workload", default="long-prompt", choices=sorted(WORKLOADS))
    h.add_argument("--load", type=float, default=1.5)
    h.add_argument("--horizons", type=_ints, default=[1000, 3000, 10000])
    h.add_argument("--policies", default="fcfs,mlfq,lanes")
    h.add_argument("--variants", default="no-guard,default,shed")
    s = sub.add_parser("study", help="policies x loads at one length")
    s.add_argument("--workloads", default="long-prompt,chat")
    s.add_argument("--loads", type=_floats, default=[1.0, 1.5, 3.0])
    s.add_argument("--num-requests", type=int, default=3000)
    s.add_argument("--policies", default="fcfs,priority,slo,sjf,mlfq,fair,lanes,adaptive")
    s.add_argument("--variants", default="default,shed")
    for p in (h, s):
        p.add_argument("--seeds", type=_ints, default=[0, 1, 2])
        p.add_argument("--jobs", type=int, default=2)
        p.add_argument("--name", default=None, help="results/steady_state/<name>.json")
        p.add_argument("--resume", action="store_true", help="reuse rows already in the JSON")
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.mode == "horizon":
        points = [
            Point(args.workload, policy, variant, args.load, n, seed)
            for n in args.horizons
            for policy in policies
            for variant in variants
            for seed in args.seeds
        ]
        by = "num_requests"
    else:
        points = [
            Point(workload, policy, variant, load, args.num_requests, seed)
            for workload in args.workloads.split(",")
            for load in args.loads
            for policy in policies
            for variant in variants
            for seed in args.seeds
        ]
        by = "load"
    name = args.name or args.mode
    path = RESULTS / f"{name}.json"
    rows = run_all(points, path, args.jobs, args.resume)
    print(f"<!-- {' '.join(sys.argv)}; {machine()} -->")
    print(table(rows, by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
