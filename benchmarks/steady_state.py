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
import math
import multiprocessing
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.policies import available_policies
from heddle.hostinfo import machine_line
from heddle.metrics.steady import Refused, interval, phase_reports, window_report
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
    # The shedder admitting up to 0.3x the TTFT target (default 0.8x): where the tail goes
    "shed-0.3": {"admission": "slo", "admission_options": {"slack": 0.3}},
    # The shedder with a looser preemption guard (30% recompute): what the guard's budget costs
    # a policy that evicts for short requests (priority on reasoning).
    "shed-guard-0.3": {"admission": "slo", "max_recompute_ratio": 0.3},
}


@dataclass(frozen=True)
class Point:
    workload: str
    policy: str
    variant: str
    load: float  # multiple of fcfs's saturation throughput
    num_requests: int
    seed: int
    # Stop at the last arrival instead of draining (the drain is outside the window anyway):
    # window throughput is exactly the drained run's; TTFTs of requests still waiting at the
    # cut are censored there, so TTFT figures of cut runs are lower bounds (never in a table).
    cut: bool = False
    arrival: str = "poisson"  # or a rate profile: "burst:peak=3,peak_seconds=30,calm=0.7"
    policy_options: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def make_workload(
    spec: Spec, seed: int, rate: float, num_requests: int, arrival: str = "poisson"
) -> Workload:
    base = get_workload(
        spec.generator,
        seed=seed,
        num_requests=num_requests,
        rate=rate,
        arrival=arrival,
        **dict(spec.options),
    )
    slos = {cls: (ttft, tpot, priority) for cls, ttft, tpot, priority in spec.slos}
    requests = []
    for r in base.requests:
        ttft, tpot, priority = slos.get(r.request_class) or slos["*"]
        requests.append(replace(r, ttft_slo=ttft, tpot_slo=tpot, priority=priority))
    return Workload(base.name, base.params, base.seed, requests)


def _simulate(
    workload: Workload, scheduler: SchedulerConfig, seed: int, until: float | None = None
) -> Any:
    """The one place that builds the simulated engine (the defaults of `heddle simulate`)."""
    from heddle.engine.replay import replay
    from heddle.sim.simulator import build_sim_engine

    config = EngineConfig(cache=CacheConfig(block_size=16), scheduler=scheduler, seed=seed)
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    assert engine.vocab_size is not None
    return replay(engine, workload, vocab_size=engine.vocab_size, until=until)


def run_point(point: Point) -> dict[str, Any]:
    spec = WORKLOADS[point.workload]
    rate = point.load * spec.saturation
    workload = make_workload(spec, point.seed, rate, point.num_requests, point.arrival)
    scheduler = SchedulerConfig(
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        policy=point.policy,
        policy_options=dict(point.policy_options),
        **VARIANTS[point.variant],
    )
    until = None
    if point.cut:
        until = math.nextafter(max(r.arrival_time for r in workload.requests), math.inf)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = _simulate(workload, scheduler, point.seed, until)
    wall = time.perf_counter() - started
    # CPU seconds of the simulation alone: what a run costs whatever else shares the machine.
    cpu = time.process_time() - cpu_started
    records = result.records
    if result.cut:
        # What the cut aborted is unfinished at the end of the run (TTFT censored there).
        records = [
            replace(r, finish_time=None, finish_reason=None) if r.finish_reason == "abort" else r
            for r in records
        ]
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
    report = window_report(records, refused, classes=spec.short)
    short = report.classes["+".join(spec.short)]
    overall = report.overall
    phases = {}
    if point.arrival != "poisson":
        reports = phase_reports(
            records, refused, point.arrival, start=result.start_time, classes=spec.short
        )
        joined = "+".join(spec.short)
        phases = {
            name: {"short": _row(r.classes[joined]), "overall": _row(r.overall)}
            for name, r in reports.items()
            if joined in r.classes
        }
    engine = result.engine
    steps = _step_use(result.step_stats, report.intervals)
    guard = engine.scheduler.preemption_guard.report() if engine is not None else {}
    admission = engine.scheduler.admission.report() if engine is not None else {}
    return {
        "point": asdict(point),
        "rate": rate,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "window": report.intervals,
        "virtual_seconds": result.elapsed,
        "short": _row(short),
        "overall": _row(overall),
        "num_preemptions": result.num_preemptions,
        "lost_tokens": guard.get("lost_tokens"),
        "computed_tokens": guard.get("computed_tokens"),
        "guard_refused": guard.get("refused"),
        "admission": admission,
        "phases": phases,
        "steps": steps,
    }


def _step_use(stats: Sequence[Any], spans: Sequence[tuple[float, float]]) -> dict[str, float]:
    """How the machine was used inside the window: the share of time a step ran (busy), mean
    seats taken, tokens per step against the budget, KV blocks in use, prefill and decode
    tokens per second."""
    inside = [s for s in stats if any(a <= s.start_time < b for a, b in spans)]
    length = sum(b - a for a, b in spans)
    if not inside or length <= 0:
        return {}
    n = len(inside)
    busy = sum(s.duration for s in inside)
    return {
        "busy": busy / length,
        "running": sum(s.num_running for s in inside) / n,
        "tokens_per_step": sum(s.num_tokens for s in inside) / n,
        "budget_per_step": sum(s.token_budget for s in inside) / n,
        "kv_used": sum(s.kv_blocks_used / s.kv_blocks_total for s in inside) / n,
        "prefill_tok_s": sum(s.num_prefill_tokens for s in inside) / length,
        "decode_tok_s": sum(s.num_decode_tokens for s in inside) / length,
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
        # This command's points in its order, then the file's other rows (a --resume file
        # written by another command with other points keeps them).
        keys = {p.key for p in points}
        rows = [done[p.key] for p in points if p.key in done]
        rows += [row for key, row in done.items() if key not in keys]
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
                f"seed {p['seed']}: {row['wall_seconds']:.1f}s wall, "
                f"{row.get('cpu_seconds', float('nan')):.1f}s CPU",
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
    return f"{machine_line()}; Python {platform.python_version()}"


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


def _policy_name(point: dict[str, Any]) -> str:
    """A policy and the options it ran with, e.g. "lanes (long_delay_seconds=10)"."""
    opts = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in point.get("policy_options") or ())  # fmt: skip
    return point["policy"] + (f" ({opts})" if opts else "")


def table(rows: Sequence[dict[str, Any]], by: str) -> str:
    """One line per (workload, policy, variant, `by`), the seeds summarized."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        p = row["point"]
        groups.setdefault((p["workload"], _policy_name(p), p["variant"], p[by]), []).append(row)
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


def throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    """Target 1: per (workload, load, policy) token and request throughput in the window, the
    ratio to fcfs's (paired by seed: same arrivals), preemptions and tokens thrown away per
    token computed (thrash)."""
    fcfs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        p = row["point"]
        if p["policy"] == "fcfs" and p["variant"] == "default":
            fcfs[(p["workload"], p["load"], p["num_requests"], p["seed"])] = row
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        p = row["point"]
        key = (p["workload"], p["load"], p["num_requests"], _policy_name(p), p["variant"])
        groups.setdefault(key, []).append(row)
    header = [
        "workload", "load", "requests", "policy", "variant", "seeds", "tok/s", "tok/s / fcfs",
        "req/s / fcfs", "decode tok/s / fcfs", "busy", "seats", "tokens/step", "KV used",
        "preempt", "lost / computed",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (workload, load, n, name, variant), members in sorted(groups.items()):
        tok, ratio, req_ratio, dec_ratio, pre, lost = [], [], [], [], [], []
        use: dict[str, list[float]] = {}
        for m in members:
            for k, v in (m.get("steps") or {}).items():
                use.setdefault(k, []).append(v)
            o = m["overall"]
            tok.append(o["total_token_throughput"])
            pre.append(float(m["num_preemptions"]))
            if m.get("computed_tokens"):
                lost.append(m["lost_tokens"] / m["computed_tokens"])
            base = fcfs.get((workload, load, n, m["point"]["seed"]))
            if base is not None:
                b = base["overall"]
                for out, mine, theirs in (
                    (ratio, o["total_token_throughput"], b["total_token_throughput"]),
                    (req_ratio, o["request_throughput"], b["request_throughput"]),
                    (
                        dec_ratio,
                        (m.get("steps") or {}).get("decode_tok_s"),
                        (base.get("steps") or {}).get("decode_tok_s"),
                    ),
                ):
                    if mine is not None and theirs:
                        out.append(mine / theirs)
        cells = [workload, f"{load:g}", str(n), name, variant, str(len(members))]
        cells += [interval(tok).text(".0f")]
        cells += [interval(v).text(".3f") if v else "-" for v in (ratio, req_ratio, dec_ratio)]
        for k, fmt in (("busy", ".3f"), ("running", ".0f"), ("tokens_per_step", ".0f")):
            cells.append(interval(use[k]).text(fmt) if k in use else "-")
        cells.append(interval(use["kv_used"]).text(".2f") if "kv_used" in use else "-")
        cells += [interval(pre).text(".0f"), interval(lost).text(".3f") if lost else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def missing_points(
    rows: Sequence[dict[str, Any]],
    workloads: Sequence[str],
    loads: Sequence[float],
    policies: Sequence[str],
) -> str:
    """Which (workload, load, policy) points of the grid have no row at default options, per
    number of requests in `rows` (target 1: every policy x workload x load)."""
    have: dict[int, set[tuple[str, float, str]]] = {}
    for row in rows:
        p = row["point"]
        if p["variant"] == "default" and not p.get("policy_options"):
            have.setdefault(p["num_requests"], set()).add((p["workload"], p["load"], p["policy"]))
    lines = []
    for n, done in sorted(have.items()):
        grid = [(w, load, pol) for w in workloads for load in loads for pol in policies]
        missing = [point for point in grid if point not in done]
        head = f"{n} requests: {len(grid) - len(missing)} of {len(grid)} points done"
        if not missing:
            lines.append(head + ", none missing.")
            continue
        by: dict[tuple[str, float], list[str]] = {}
        for w, load, pol in missing:
            by.setdefault((w, load), []).append(pol)
        parts = [f"{w} at {load:g}x: {', '.join(pols)}" for (w, load), pols in by.items()]
        lines.append(head + "; missing: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def phase_table(rows: Sequence[dict[str, Any]]) -> str:
    """Bursty arrivals: one line per (workload, policy, variant, arrival, phase)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        p = row["point"]
        for phase, parts in sorted(row.get("phases", {}).items()):
            key = (p["workload"], p["policy"], p["variant"], p["arrival"], phase)
            groups.setdefault(key, []).append(parts)
    header = ["workload", "policy", "variant", "arrival", "phase", "seeds"]
    header += [c[0] for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (workload, policy, variant, arrival, phase), members in groups.items():
        cells = [workload, policy, variant, arrival, phase, str(len(members))]
        for _, part, name, fmt in COLUMNS:
            values = [m[part][name] for m in members if m[part][name] is not None]
            cells.append(interval(values).text(fmt) if values else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _options(text: str) -> tuple[tuple[str, Any], ...]:
    """Parse "long_share=0.5,x=1" into (("long_share", 0.5), ("x", 1)); values as JSON numbers."""
    out = []
    for item in text.split(","):
        if item:
            key, _, value = item.partition("=")
            out.append((key, json.loads(value)))
    return tuple(out)


DEFAULT_POLICIES = "fcfs,priority,slo,sjf,oracle,mlfq,fair,lanes,adaptive,plas"
GRID_WORKLOADS = ("long-prompt", "chat", "reasoning", "multi-tenant")


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
    s.add_argument("--policies", default=DEFAULT_POLICIES)
    s.add_argument("--variants", default="default,shed")
    t = sub.add_parser(
        "throughput", help="target 1: throughput vs fcfs's under sustained overload (cut runs)"
    )
    t.add_argument("--workloads", default="long-prompt,chat,reasoning,multi-tenant")
    t.add_argument("--loads", type=_floats, default=[1.5, 3.0])
    t.add_argument("--num-requests", type=int, default=30000)
    t.add_argument("--policies", default=DEFAULT_POLICIES)
    t.add_argument("--variants", default="default")
    b = sub.add_parser("burst", help="bursty arrivals, reported per phase (burst / calm)")
    b.add_argument("--workload", default="long-prompt", choices=sorted(WORKLOADS))
    b.add_argument("--arrival", default="burst:peak=3,peak_seconds=30,calm=0.7,calm_seconds=180")
    b.add_argument("--num-requests", type=int, default=10000)
    b.add_argument("--policies", default="fcfs,mlfq,lanes")
    b.add_argument("--variants", default="default,shed")
    r = sub.add_parser("table", help="print the table of saved JSON files (merged)")
    r.add_argument("files", nargs="+", type=Path)
    r.add_argument("--by", default="load", choices=["load", "num_requests", "throughput", "phase"])
    r.add_argument("--load", type=float, default=None, help="only the rows at this load")
    r.add_argument(
        "--grid",
        action="store_true",
        help="with --by throughput: also list the points of target 1's grid (every workload x "
        "load 1.5, 3 x policy, default options) that have no row",
    )
    for p in (h, s, t, b):
        p.add_argument("--seeds", type=_ints, default=[0, 1, 2])
        p.add_argument("--policy-options", type=_options, default=(), help="k=v,... for all")
        p.add_argument("--jobs", type=int, default=2)
        p.add_argument("--name", default=None, help="results/steady_state/<name>.json")
        p.add_argument("--resume", action="store_true", help="reuse rows already in the JSON")
    args = parser.parse_args(argv)
    if args.mode == "table":
        rows = [row for f in args.files for row in json.loads(f.read_text())["rows"]]
        # One row per point: the same point saved in two files (a rerun) counts once.
        rows = list({json.dumps(row["point"], sort_keys=True): row for row in rows}.values())
        if args.load is not None:
            rows = [row for row in rows if row["point"]["load"] == args.load]
        machines = sorted({json.loads(f.read_text())["machine"] for f in args.files})
        print(f"<!-- {' '.join(str(f) for f in args.files)}; {'; '.join(machines)} -->")
        print(_render(rows, args.by))
        if args.grid:
            print()
            print(missing_points(rows, GRID_WORKLOADS, (1.5, 3.0), DEFAULT_POLICIES.split(",")))
        return 0
    policies = args.policies.split(",")
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    unknown = sorted(set(policies) - set(available_policies()))
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {', '.join(available_policies())}")
    opts = args.policy_options
    if args.mode == "horizon":
        points = [
            Point(args.workload, policy, variant, args.load, n, seed, policy_options=opts)
            for n in args.horizons
            for policy in policies
            for variant in variants
            for seed in args.seeds
        ]
        by = "num_requests"
    elif args.mode == "burst":
        points = [
            Point(args.workload, policy, variant, 1.0, args.num_requests, seed, False, args.arrival,
                  opts)
            for policy in policies
            for variant in variants
            for seed in args.seeds
        ]  # fmt: skip
        by = "phase"
    else:
        cut = args.mode == "throughput"
        points = [
            Point(
                workload, policy, variant, load, args.num_requests, seed, cut, policy_options=opts
            )
            for workload in args.workloads.split(",")
            for load in args.loads
            for policy in policies
            for variant in variants
            for seed in args.seeds
        ]
        by = "throughput" if cut else "load"
    name = args.name or args.mode
    path = RESULTS / f"{name}.json"
    rows = run_all(points, path, args.jobs, args.resume)
    print(f"<!-- {' '.join(sys.argv)}; {machine()} -->")
    print(_render(rows, by))
    return 0


def _render(rows: Sequence[dict[str, Any]], by: str) -> str:
    if by == "throughput":
        return throughput_table(rows)
    if by == "phase":
        return phase_table(rows)
    return table([r for r in rows if not r["point"].get("cut")], by)


if __name__ == "__main__":
    sys.exit(main())
