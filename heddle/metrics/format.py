"""Terminal output of a Summary: one rich table, a row per request class and one for all."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from heddle.metrics.stats import LatencyStats
from heddle.metrics.summary import ClassSummary, Summary

# (header, latency metric, statistic): latencies are shown in milliseconds.
LATENCY_COLUMNS = (
    ("TTFT p50", "ttft", "p50"),
    ("TTFT p99", "ttft", "p99"),
    ("TPOT p50", "tpot", "p50"),
    ("TPOT p99", "tpot", "p99"),
    ("ITL p99", "itl", "p99"),
    ("E2E p50", "e2e", "p50"),
    ("E2E p99", "e2e", "p99"),
    ("queue p99", "queue_time", "p99"),
    ("stall mean", "stall_time", "mean"),
    ("blocked mean", "blocked_time", "mean"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(c: ClassSummary, with_goodput: bool) -> list[str]:
    done = str(c.num_completed)
    if c.num_failed:
        done += f" ({c.num_failed} failed)"
    if c.num_unfinished:
        done += f" ({c.num_unfinished} unfinished)"
    row = [c.request_class, str(c.num_requests), done, str(c.num_preemptions)]
    for _, metric, stat in LATENCY_COLUMNS:
        stats: LatencyStats = getattr(c, metric)
        row.append(_ms(getattr(stats, stat)))
    util = "-" if c.step_utilization is None else f"{c.step_utilization:.0%}"
    row += [util, _rate(c.request_throughput), f"{c.output_throughput:.1f}"]
    if with_goodput:
        attained = c.slo_attainment
        share = "" if attained is None else f" ({attained:.0%})"
        row.append(_rate(c.goodput) + share)
    return row


def format_summary(summary: Summary, title: str | None = None) -> Table:
    """The summary as a rich Table (latencies in ms, throughputs per second)."""
    with_goodput = summary.overall.goodput is not None
    caption = f"over {summary.duration:.2f} s"
    if summary.slo is not None:
        parts = [
            f"{name} <= {_ms(value)} ms"
            for name, value in (("TTFT", summary.slo.ttft), ("TPOT", summary.slo.tpot))
            if value is not None
        ]
        if parts:
            caption += "; SLO " + ", ".join(parts)
    table = Table(title=title, caption=caption)
    table.add_column("class", style="bold")
    for header in ("reqs", "done", "preempt"):
        table.add_column(header, justify="right")
    for header, _, _ in LATENCY_COLUMNS:
        table.add_column(f"{header}\n(ms)", justify="right")
    table.add_column("step\nutil", justify="right")
    table.add_column("req/s", justify="right")
    table.add_column("out tok/s", justify="right")
    if with_goodput:
        table.add_column("goodput\nreq/s", justify="right")
    rows = list(summary.classes.values())
    for c in rows:
        table.add_row(*_row(c, with_goodput))
    if len(rows) != 1:
        table.add_row(*_row(summary.overall, with_goodput), style="bold")
    return table


def summary_text(summary: Summary, title: str | None = None, width: int = 200) -> str:
    """The table as plain text (no colour), e.g. for logs and docs."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(
        format_summary(summary, title)
    )
    return buffer.getvalue()


def print_summary(
    summary: Summary, title: str | None = None, console: Console | None = None
) -> None:
    (console or Console()).print(format_summary(summary, title))
