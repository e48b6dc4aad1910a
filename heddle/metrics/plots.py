"""Plots written straight to PNG files with matplotlib's Agg canvas (no display, no pyplot).

Figures are built with `matplotlib.figure.Figure`, so nothing touches pyplot's global state and
plotting is safe from a server thread or a test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat
from heddle.metrics.summary import is_completed
from heddle.metrics.sweep import SweepPoint

# Above these sizes the batch-composition raster is unreadable and is left out.
MAX_RASTER_REQUESTS = 300
MAX_RASTER_STEPS = 5000

_CDF_METRICS: tuple[tuple[str, Callable[[RequestRecord], float | None]], ...] = (
    ("TTFT", lambda r: r.ttft),
    ("TPOT", lambda r: r.tpot),
    ("E2E latency", lambda r: r.e2e),
)


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def _cdf(ax: Axes, values: list[float], label: str) -> None:
    values = sorted(values)
    n = len(values)
    ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})")


def plot_latency_cdfs(
    records_by_label: Mapping[str, Sequence[RequestRecord]],
    path: str | os.PathLike[str],
    by_class: bool | None = None,
    title: str | None = None,
) -> Path:
    """CDFs of TTFT, TPOT and E2E latency (completed requests), one subplot each.

    One line per label, or per label and request class when `by_class` (default: only when a
    single label is given and it holds several classes).
    """
    if by_class is None:
        classes = {r.request_class for rs in records_by_label.values() for r in rs}
        by_class = len(records_by_label) == 1 and len(classes) > 1
    series: dict[str, list[RequestRecord]] = {}
    for label, records in records_by_label.items():
        for r in records:
            if not is_completed(r):
                continue
            key = label
            if by_class:
                key = (
                    r.request_class if len(records_by_label) == 1 else f"{label}/{r.request_class}"
                )
            series.setdefault(key, []).append(r)
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    axes = fig.subplots(1, len(_CDF_METRICS))
    for ax, (name, metric) in zip(axes, _CDF_METRICS, strict=True):
        for key, records in sorted(series.items()):
            values = [v for v in (metric(r) for r in records) if v is not None]
            if values:
                _cdf(ax, [v * 1000 for v in values], key)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.ticklabel_format(axis="x", useOffset=False)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small", loc="lower right")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_timeline(
    steps: Sequence[StepStat], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Per step over time: prefill vs decode tokens (stacked, with the token budget), batch
    size and waiting queue, KV blocks in use; and for small runs a raster of which requests
    took part in each step."""
    request_order: dict[str, int] = {}
    for s in steps:
        for rid in s.request_ids:
            request_order.setdefault(rid, len(request_order))
    raster = 0 < len(request_order) <= MAX_RASTER_REQUESTS and len(steps) <= MAX_RASTER_STEPS
    rows = 4 if raster else 3
    fig = Figure(figsize=(12, 2.6 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, 1)
    tokens_ax, batch_ax, kv_ax = axes[0], axes[1], axes[2]
    t = [s.start_time for s in steps]
    # Each step is a box from its start to its end: one polygon for all steps draws fast
    # even for long runs, and idle gaps between steps show as zero.
    xs: list[float] = []
    for s in steps:
        xs += (s.start_time, s.start_time, s.start_time + s.duration, s.start_time + s.duration)
    prefill = [v for s in steps for v in (0, s.num_prefill_tokens, s.num_prefill_tokens, 0)]
    total = [v for s in steps for v in (0, s.num_tokens, s.num_tokens, 0)]
    tokens_ax.fill_between(xs, 0, prefill, color="tab:orange", lw=0, label="prefill tokens")
    tokens_ax.fill_between(xs, prefill, total, color="tab:blue", lw=0, label="decode tokens")
    if any(s.token_budget for s in steps):
        budget = [s.token_budget for s in steps]
        tokens_ax.step(t, budget, where="post", color="k", lw=0.8, label="token budget")
    tokens_ax.set_ylabel("tokens per step")
    batch_ax.step(t, [s.num_running for s in steps], where="post", label="running")
    batch_ax.step(t, [s.num_waiting for s in steps], where="post", label="waiting")
    batch_ax.step(t, [s.num_requests for s in steps], where="post", label="in step", lw=0.8)
    batch_ax.set_ylabel("requests")
    kv_ax.step(t, [s.kv_blocks_used for s in steps], where="post", label="blocks used")
    if steps:
        kv_ax.axhline(max(s.kv_blocks_total for s in steps), color="k", lw=0.8, label="total")
    kv_ax.set_ylabel("KV blocks")
    kv_ax.set_xlabel("time (s)")
    for ax in (tokens_ax, batch_ax):
        ax.sharex(kv_ax)
    for ax in (tokens_ax, batch_ax, kv_ax):
        ax.grid(alpha=0.3)
        if steps:
            ax.legend(fontsize="small", loc="upper right")
    if raster:
        _raster(axes[3], steps, request_order)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _raster(ax: Axes, steps: Sequence[StepStat], request_order: dict[str, int]) -> None:
    xs = [i for i, s in enumerate(steps) for _ in s.request_ids]
    ys = [request_order[rid] for s in steps for rid in s.request_ids]
    ax.scatter(xs, ys, marker="s", s=max(1.0, 4000 / max(len(steps), 1)), lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel("request (by first step)")
    ax.set_ylim(-1, len(request_order))
    ax.invert_yaxis()
    ax.set_title("batch composition", fontsize="small")


def plot_sweep(
    points: Sequence[SweepPoint], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Throughput and p99 latencies against offered load, one line per series."""
    series: dict[str, list[SweepPoint]] = {}
    for p in points:
        series.setdefault(p.series, []).append(p)
    panels: tuple[tuple[str, Callable[[SweepPoint], float | None], float], ...] = (
        ("output throughput (tok/s)", lambda p: p.output_throughput, 1.0),
        ("request throughput (req/s)", lambda p: p.request_throughput, 1.0),
        ("p99 TTFT (ms)", lambda p: p.ttft_p99, 1000.0),
        ("p99 TPOT (ms)", lambda p: p.tpot_p99, 1000.0),
    )
    fig = Figure(figsize=(12, 8), layout="constrained")
    axes = fig.subplots(2, 2).flatten()
    for ax, (label, metric, factor) in zip(axes, panels, strict=True):
        for name, pts in sorted(series.items()):
            pts = sorted(pts, key=lambda p: p.offered_load)
            xy = [(p.offered_load, v * factor) for p in pts if (v := metric(p)) is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), marker="o", label=name)
        if label.startswith("request throughput") and points:
            top = max(p.offered_load for p in points)
            ax.plot([0, top], [0, top], color="k", lw=0.6, ls="--", label="offered")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return _save(fig, path)
