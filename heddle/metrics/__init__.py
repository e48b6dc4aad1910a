"""Request records and the reports computed from them (bench, simulate and /metrics alike).

The plotting functions (plot_latency_cdfs, plot_timeline, plot_sweep) live in
heddle.metrics.plots and are imported on first use, so importing heddle.metrics stays cheap.
"""

from __future__ import annotations

from typing import Any

from heddle.metrics.fairness import FairnessReport, UserService, WindowService, fairness
from heddle.metrics.format import format_summary, print_summary, summary_text
from heddle.metrics.jsonl import (
    record_from_dict,
    record_to_dict,
    records_from_jsonl,
    records_to_jsonl,
    steps_from_jsonl,
    steps_to_jsonl,
)
from heddle.metrics.record import RequestRecord
from heddle.metrics.stats import LatencyStats, percentile
from heddle.metrics.steps import StepStat
from heddle.metrics.summary import (
    SLO,
    ClassSummary,
    Summary,
    is_completed,
    is_failed,
    meets_slo,
    summarize,
)
from heddle.metrics.sweep import SweepPoint

_PLOTS = ("plot_latency_cdfs", "plot_sweep", "plot_timeline")

__all__ = [
    "SLO",
    "ClassSummary",
    "FairnessReport",
    "LatencyStats",
    "RequestRecord",
    "StepStat",
    "Summary",
    "SweepPoint",
    "UserService",
    "WindowService",
    "fairness",
    "format_summary",
    "is_completed",
    "is_failed",
    "meets_slo",
    "percentile",
    "plot_latency_cdfs",
    "plot_sweep",
    "plot_timeline",
    "print_summary",
    "record_from_dict",
    "record_to_dict",
    "records_from_jsonl",
    "records_to_jsonl",
    "steps_from_jsonl",
    "steps_to_jsonl",
    "summarize",
    "summary_text",
]


def __getattr__(name: str) -> Any:
    if name in _PLOTS:  # matplotlib is slow to import: only when a plot is asked for
        from heddle.metrics import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'heddle.metrics' has no attribute {name!r}")
