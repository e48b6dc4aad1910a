"""Markdown tables and plots of the policy study, from its JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .spec import POLICIES, TARGET_LOADS
from .targets import Metrics, check_targets, get, short_p99_ttft

Points = Sequence[dict[str, Any]]


def _s(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    if unit == "ms":
        return f"{1000 * x:.0f}" if x >= 0.01 else f"{1000 * x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _gap(m: Metrics) -> str:
    f = m["fairness"]
    return f"{f['max_service_difference']:.0f} / {f['queued_max_service_difference']:.0f}"


SWEEP_COLUMNS: tuple[tuple[str, Callable[[Metrics], str]], ...] = (
    ("short-class p99 TTFT (s)", lambda m: _s(short_p99_ttft(m))),
    ("goodput (req/s within SLO, over the run's span)", lambda m: _s(m["overall"]["goodput"])),
    (
        "throughput (prompt + output tok/s)",
        lambda m: f"{m['overall']['total_token_throughput']:.0f}",
    ),
)
FAIRNESS_COLUMN = (
    "max service difference between users backlogged in a 2 s window (weighted tokens): "
    "in the system / queued",
    _gap,
)


def sweep_tables(points: Points, key: str, loads: Sequence[float]) -> list[str]:
    """Per metric, policies x loads (seed 0)."""
    columns = [*SWEEP_COLUMNS, *([FAIRNESS_COLUMN] if key == "multi-tenant" else [])]
    lines: list[str] = []
    for title, cell in columns:
        rows = []
        for policy in POLICIES:
            ms = [get(points, key, policy, load) for load in loads]
            if any(m is not None for m in ms):
                rows.append([policy, *(cell(m) if m else "-" for m in ms)])
        lines += [f"{title}, by load:", ""]
        lines += [*_table(["policy", *(f"{x:g}" for x in loads)], rows), ""]
    return lines


DETAIL_HEADER = (
    "policy", "req/s", "tok/s", "goodput", "in SLO", "preempt", "class", "TTFT p50 (s)",
    "TTFT p99 (s)", "TPOT p50 (ms)", "TPOT p99 (ms)", "E2E mean (s)", "stall mean (s)",
    "blocked mean (s)",
)  # fmt: skip


def detail_table(points: Points, key: str, load: float, tag: str = "") -> list[str]:
    """Every policy at one load, per class (seed 0)."""
    rows = []
    for policy in POLICIES:
        m = get(points, key, policy, load, tag=tag)
        if m is None:
            continue
        o = m["overall"]
        first = [
            policy,
            f"{o['request_throughput']:.1f}",
            f"{o['total_token_throughput']:.0f}",
            _s(o["goodput"]),
            f"{100 * (o['slo_attainment'] or 0):.0f}%",
            str(o["num_preemptions"]),
        ]
        for i, (name, c) in enumerate(sorted(m["classes"].items())):
            row = first if i == 0 else [""] * len(first)
            rows.append(
                [
                    *row,
                    name,
                    _s(c["ttft"]["p50"]),
                    _s(c["ttft"]["p99"]),
                    _s(c["tpot"]["p50"], "ms"),
                    _s(c["tpot"]["p99"], "ms"),
                    _s(c["e2e"]["mean"]),
                    _s(c["stall_time"]["mean"]),
                    _s(c["blocked_time"]["mean"]),
                ]
            )
    return _table(DETAIL_HEADER, rows)


def capacity_table(data: dict[str, Any]) -> list[str]:
    rows = []
    for c in data["capacity"]:
        q, s = c["point"], c["saturation"]
        rows.append(
            [
                q["workload"],
                q["policy"],
                str(q["seed"]),
                f"{q['rate']:g}",
                str(q["num_requests"]),
                f"{s['requests_per_s']:.2f}",
                f"{s['output_tokens_per_s']:.0f}",
            ]
        )
    header = ["workload", "policy", "seed", "probe req/s", "requests", "saturation req/s",
              "output tok/s"]  # fmt: skip
    return _table(header, rows)


def target_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        load = "-" if r["load"] is None else f"{r['load']:g}"
        verdict = {True: "met", False: "**not met**", None: "(context)"}[r["met"]]
        out.append([str(r["target"]), r["workload"], load, r["policy"], r["what"], r["value"],
                    verdict])  # fmt: skip
    header = ["target", "workload", "load", "policy", "measured", "median (range) over seeds",
              "verdict"]  # fmt: skip
    return _table(header, out)


def variant_table(points: Points) -> list[str]:
    """Runs with other options or seats (tagged points) next to fcfs and the tuned policy, one
    row per workload and load (seed 0): short-class p99 TTFT (s) / goodput (req/s) / in SLO."""
    variants = [p for p in points if p["point"]["tag"] not in ("", "orca")]
    columns = ["fcfs"]
    for p in variants:
        for name in (p["point"]["policy"], p["point"]["tag"]):
            if name not in columns:
                columns.append(name)
    cells: dict[tuple[str, float], dict[str, str]] = {}
    for p in variants:
        q = p["point"]
        row = cells.setdefault((q["workload"], q["load"]), {})
        row[q["tag"]] = _cell(p["metrics"])
        for policy in ("fcfs", q["policy"]):
            m = get(points, q["workload"], policy, q["load"], q["seed"])
            if m is not None:
                row[policy] = _cell(m)
    rows = [[key, f"{load:g}", *(row.get(c, "-") for c in columns)]
            for (key, load), row in cells.items()]  # fmt: skip
    return _table(["workload", "load", *columns], rows)


def _cell(m: Metrics) -> str:
    o = m["overall"]
    return f"{_s(short_p99_ttft(m))} / {_s(o['goodput'])} / {100 * (o['slo_attainment'] or 0):.0f}%"


def orca_table(points: Points) -> list[str]:
    rows = []
    for p in points:
        q, m = p["point"], p["metrics"]
        if q["tag"] != "orca":
            continue
        o = m["overall"]
        rows.append([q["workload"], str(q["seed"]), f"{q['load']:g}", f"{q['rate']:.2f}",
                     q["policy"], _s(o["ttft"]["p50"]), _s(o["ttft"]["p99"]), _s(o["e2e"]["mean"]),
                     _s(o["e2e"]["p99"]), _s(o["tpot"]["p50"], "ms")])  # fmt: skip
    header = ["workload", "seed", "load (of static's saturation)", "req/s", "policy",
              "TTFT p50 (s)", "TTFT p99 (s)", "E2E mean (s)", "E2E p99 (s)", "TPOT p50 (ms)"]  # fmt: skip
    return _table(header, rows)


def predictor_table(points: Points, loads: Sequence[float]) -> list[str]:
    rows = []
    for key in sorted({p["point"]["workload"] for p in points}):
        for load in loads:
            m = get(points, key, "sjf", load)
            if m and m.get("predictor"):
                pr = m["predictor"]
                rows.append([key, f"{load:g}", str(pr["num_samples"]),
                             f"{pr['mean_abs_error']:.0f}", f"{100 * pr['mean_rel_error']:.0f}%"])  # fmt: skip
    header = ["workload", "load", "finished", "mean abs error (tokens)", "mean relative error"]
    return _table(header, rows)


def write_report(data: dict[str, Any], plots: Path, md_path: Path) -> None:
    points = [p for p in data["points"] if "metrics" in p]
    main = [p for p in points if not p["point"]["tag"]]
    loads = sorted({p["point"]["load"] for p in main})
    keys = [k for k in ("chat", "long-prompt", "reasoning", "multi-tenant")
            if any(p["point"]["workload"] == k for p in main)]  # fmt: skip
    lines = [f"Setup: {data['setup']['describe']}. Run on {data['machine']} in "
             f"{data['wall_seconds']:.0f} s: `{data['command']}`", ""]  # fmt: skip
    lines += ["### Saturation throughput", "", *capacity_table(data), ""]
    lines += ["### Targets", "", *target_table(check_targets(data)), ""]
    for key in keys:
        lines += [f"### {key}", "", *sweep_tables(main, key, loads)]
        for load in (x for x in TARGET_LOADS if x in loads):
            lines += [f"All classes at load {load:g}:", "", *detail_table(main, key, load), ""]
    lines += ["### Other options", "", *variant_table(points), ""]
    lines += ["### static vs fcfs (Orca)", "", *orca_table(points), ""]
    lines += ["### sjf's output-length predictor", "", *predictor_table(main, loads), ""]
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {md_path}")
    for path in write_plots(main, keys, loads, plots):
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


def write_real_report(data: dict[str, Any], md_path: Path, plots: Path | None = None) -> None:
    """The real-engine runs: saturation, the targets they can check (1 and 2), and per
    workload the sweep tables and every class at the highest load."""
    points = data["points"]
    loads = sorted({p["point"]["load"] for p in points})
    keys = [k for k in ("chat", "long-prompt", "reasoning", "multi-tenant")
            if any(p["point"]["workload"] == k for p in points)]  # fmt: skip
    engine = data["engine"]
    lines = [f"Real engine: {engine['model']}, token budget {engine['max_num_batched_tokens']}, "
             f"{engine['max_num_seqs']} seats; {data['machine']}; "
             f"{data['engine_seconds']:.0f} s of engine time: `{data['command']}`", ""]  # fmt: skip
    lines += ["### Saturation throughput", "", *capacity_table(data), ""]
    lines += ["### Targets", "", *target_table(check_targets(data)), ""]
    for key in keys:
        lines += [f"### {key}", "", *sweep_tables(points, key, loads)]
        lines += [f"All classes at load {loads[-1]:g}:", "", *detail_table(points, key, loads[-1])]
        lines += [""]
    md_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {md_path}")
    if plots is not None:
        for path in write_plots(points, keys, loads, plots):
            print(f"wrote {path}")


# -- plots ----------------------------------------------------------------------------------
def _short_tpot_ms(m: Metrics) -> float | None:
    p99 = (m["short"] or m["overall"])["tpot"]["p99"]
    return None if p99 is None else 1000 * p99


PANELS: dict[str, tuple[tuple[str, Callable[[Metrics], float | None], bool], ...]] = {
    "policies_latency.png": (
        ("short-class p99 TTFT (s)", short_p99_ttft, True),
        ("short-class p99 TPOT (ms)", _short_tpot_ms, False),
    ),
    "policies_goodput.png": (
        ("goodput (req/s within SLO)", lambda m: m["overall"]["goodput"], False),
        ("throughput (tokens/s)", lambda m: m["overall"]["total_token_throughput"], False),
    ),
}


def _series(
    points: Points, key: str, policy: str, loads: Sequence[float], metric: Callable[..., Any]
) -> tuple[list[float], list[float]]:
    xy = [(x, metric(m)) for x in loads if (m := get(points, key, policy, x)) is not None]
    xy = [(x, y) for x, y in xy if y is not None]
    return [x for x, _ in xy], [y for _, y in xy]


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=64)
    return path


def write_plots(
    points: Points, keys: Sequence[str], loads: Sequence[float], out: Path
) -> list[Path]:
    paths = []
    for name, rows in PANELS.items():
        fig = Figure(figsize=(4 * len(keys), 3.3 * len(rows)), layout="constrained")
        axes = fig.subplots(len(rows), len(keys), squeeze=False)
        for r, (label, metric, log) in enumerate(rows):
            for c, key in enumerate(keys):
                ax = axes[r][c]
                for i, policy in enumerate(POLICIES):
                    xs, ys = _series(points, key, policy, loads, metric)
                    if xs:
                        ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=f"C{i}", label=policy)
                if log:
                    ax.set_yscale("log")
                ax.set_title(key if r == 0 else "", fontsize="medium")
                ax.set_ylabel(label if c == 0 else "")
                ax.set_xlabel("load (fraction of fcfs saturation)" if r == len(rows) - 1 else "")
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize="x-small", ncol=2)
        paths.append(_save(fig, out / name))
    if "multi-tenant" in keys:
        paths.append(_fairness_plot(points, loads, out / "policies_fairness.png"))
    return paths


def _fairness_plot(points: Points, loads: Sequence[float], path: Path) -> Path:
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    gap_ax, ttft_ax = fig.subplots(1, 2)
    for i, policy in enumerate(POLICIES):
        for ax, metric in (
            (gap_ax, lambda m: m["fairness"]["queued_max_service_difference"]),
            (ttft_ax, short_p99_ttft),
        ):
            xs, ys = _series(points, "multi-tenant", policy, loads, metric)
            if xs:
                ax.plot(xs, ys, marker="o", ms=3, color=f"C{i}", label=policy)
    gap_ax.set_ylabel("max service difference between users\nboth queued for 2 s (weighted tokens)")
    ttft_ax.set_ylabel("light users' p99 TTFT (s)")
    ttft_ax.set_yscale("log")
    for ax in (gap_ax, ttft_ax):
        ax.set_xlabel("load (fraction of fcfs saturation)")
        ax.grid(alpha=0.3)
    gap_ax.legend(fontsize="x-small", ncol=2)
    fig.suptitle("multi-tenant: one user sends 70% of the requests, three share the rest")
    return _save(fig, path)
