"""`python -m benchmarks.policy_study sim | report | real`: the command line of the study."""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .real import add_real_arguments, run_real
from .report import write_report
from .sim import Point, SimSetup, cache_key, run_points
from .spec import POLICIES, SIM_WORKLOADS, TARGET_LOADS
from .targets import best_short_ttft

RESULTS = Path("results")
# Plots go under results/ unless asked for elsewhere: the figures in docs/ are written only by
# `--plots docs/policies` (docs/POLICIES.md gives the commands).
PLOTS = RESULTS / "policies"
ORCA_WORKLOADS = ("chat", "reasoning")  # mixed output lengths
ORCA_LOADS = (0.5, 0.9)  # fractions of static's saturation throughput
ORCA_REQUESTS = 300
STATIC_PROBE_REQUESTS = 600
# Policies rerun at the target loads with other options or seats (None: the setup's), as
# evidence for the tuning and for how much a bigger batch absorbs: (policy, options, seats, tag).
VARIANTS: tuple[tuple[str, dict[str, Any], int | None, str], ...] = (
    ("slo", {"late_factor": 1.0}, None, "slo, default late_factor=1"),
    ("slo", {"preempt": False}, None, "slo, no preemption"),
    ("fcfs", {}, 1024, "fcfs, 1024 seats"),
    ("adaptive", {}, 1024, "adaptive, 1024 seats"),
    ("mlfq", {"max_preemptions": 1}, None, "mlfq, max_preemptions=1"),
)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _names(text: str, known: Any) -> list[str]:
    names = [x for x in text.split(",") if x]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {unknown}; known: {', '.join(known)}")
    return names


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    setup = SimSetup()
    workloads = _names(args.workloads, SIM_WORKLOADS)
    policies = [p for p in _names(args.policies, POLICIES) if p != "static"]
    loads = _floats(args.loads)
    seeds = [int(s) for s in args.extra_seeds.split(",") if s]
    orca = [k for k in ORCA_WORKLOADS if k in workloads and not args.no_orca]
    cache: dict[str, Any] = {}
    if args.resume and args.output.exists():
        old = json.loads(args.output.read_text())
        for r in old["capacity"] + old["points"]:
            cache[cache_key(r["point"], r["options"])] = r
    started = time.perf_counter()

    def n_of(key: str) -> int:
        return args.num_requests or SIM_WORKLOADS[key].num_requests

    def probe(key: str, policy: str, seed: int) -> Point:
        spec = SIM_WORKLOADS[key]
        # static is so slow that its queue never drains and each batch samples the arrival mix
        # afresh: a few hundred requests reach its steady state.
        n = spec.probe_requests if policy == "fcfs" else STATIC_PROBE_REQUESTS
        if args.num_requests:  # a quick look: too few requests to overload by rate
            return Point(key, policy, 0.0, math.inf, seed, args.num_requests)
        return Point(key, policy, 0.0, spec.probe_rate, seed, n)

    # 1. Saturation throughput of fcfs (seed 0: the load unit) and, for Orca, of fcfs and
    # static on every seed.
    probes = [probe(k, "fcfs", 0) for k in workloads]
    probes += [probe(k, p, s) for s in [0, *seeds] for k in orca for p in ("fcfs", "static")]
    capacity = run_points(dict.fromkeys(probes), setup, args.jobs, probe=True, cache=cache)
    saturation = {
        (r["point"]["workload"], r["point"]["policy"], r["point"]["seed"]): r["saturation"][
            "requests_per_s"
        ]
        for r in capacity
    }
    fcfs_rate = {k: saturation[(k, "fcfs", 0)] for k in workloads}

    # 2. The sweep: every policy, every load, seed 0.
    sweep = [
        Point(k, p, load, load * fcfs_rate[k], 0, n_of(k))
        for k in workloads
        for load in loads
        for p in policies
    ]
    points = run_points(sweep, setup, args.jobs, cache=cache)

    # 3. More seeds for the points the targets are judged on.
    checks = target_points(points, seeds, fcfs_rate, n_of)
    checks += [
        Point(k, policy, load, load * fcfs_rate[k], 0, n_of(k), tuple(options.items()), tag, seats)
        for policy, options, seats, tag in VARIANTS
        if policy in policies and not args.no_variants
        for k in workloads
        for load in loads
        if load in TARGET_LOADS
    ]
    # 4. Orca: fcfs and static at the same rates, fractions of static's saturation.
    checks += [
        Point(k, p, load, load * saturation[(k, "static", 0)], s, ORCA_REQUESTS, tag="orca")
        for s in [0, *seeds]
        for k in orca
        for load in ORCA_LOADS
        for p in ("fcfs", "static")
    ]
    points += run_points(checks, setup, args.jobs, cache=cache)
    return {
        "setup": {**setup.__dict__, "describe": setup.describe()},
        "machine": machine(),
        "command": " ".join(sys.argv),
        "wall_seconds": time.perf_counter() - started,
        "loads": loads,
        "capacity": capacity,
        "points": points,
    }


def target_points(
    points: list[dict[str, Any]], seeds: list[int], fcfs_rate: dict[str, float], n_of: Any
) -> list[Any]:
    """Points to rerun with `seeds`: fcfs, slo and the best short-TTFT policy at the target
    loads on every workload, and sjf/oracle on chat at every load above 0.8."""
    wanted: set[tuple[str, str, float]] = set()
    loads = sorted({p["point"]["load"] for p in points})
    for key in {p["point"]["workload"] for p in points}:
        for load in (x for x in loads if x in TARGET_LOADS):
            wanted |= {(key, "fcfs", load), (key, "slo", load)}
            best = best_short_ttft(points, key, load, seed=0)
            if best is not None:
                wanted.add((key, best, load))
        if key == "chat":
            wanted |= {(key, p, x) for p in ("fcfs", "sjf", "oracle") for x in loads if x > 0.8}
    ran = {p["point"]["policy"] for p in points}  # a study of some policies reruns only those
    return [
        Point(k, p, load, load * fcfs_rate[k], s, n_of(k))
        for s in seeds
        for k, p, load in sorted(wanted)
        if p in ran
    ]


def machine() -> str:
    import os

    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sim = sub.add_parser("sim", help="the study in the simulator")
    sim.add_argument("--workloads", default=",".join(SIM_WORKLOADS))
    sim.add_argument("--policies", default=",".join(POLICIES))
    sim.add_argument("--loads", default="0.7,0.85,1.0,1.2,1.5,2.0", help="fractions of fcfs saturation")
    sim.add_argument("--extra-seeds", default="1,2", help="seeds for the target checks")
    sim.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="default: per workload; probes then queue all requests at once",
    )
    sim.add_argument("--no-orca", action="store_true", help="skip the static (Orca) runs")
    sim.add_argument(
        "--no-variants", action="store_true", help="skip the runs with other options or seats"
    )
    sim.add_argument("--resume", action="store_true", help="reuse points already in --output")
    sim.add_argument("--jobs", type=int, default=2, help="worker processes")
    sim.add_argument("--output", type=Path, default=RESULTS / "policies_sim.json")
    sim.add_argument("--plots", type=Path, default=PLOTS, help=f"default: {PLOTS}")
    report = sub.add_parser("report", help="tables and plots from a sim JSON")
    report.add_argument("--output", type=Path, default=RESULTS / "policies_sim.json")
    report.add_argument("--plots", type=Path, default=PLOTS, help=f"default: {PLOTS}")
    real = sub.add_parser("real", help="the study on the real CPU engine")
    add_real_arguments(real)
    args = parser.parse_args()

    if args.mode == "real":
        run_real(args)
        return
    if args.mode == "sim":
        data = run_sim(args)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.output} ({data['wall_seconds']:.0f} s)")
    else:
        data = json.loads(args.output.read_text())
    write_report(data, args.plots, args.output.with_suffix(".md"))


if __name__ == "__main__":
    main()
