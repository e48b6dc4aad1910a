"""Request records and the reports computed from them (bench, simulate and /metrics alike).

Terminal output (heddle.metrics.format: rich) and plots (heddle.metrics.plots: matplotlib) are
imported on first use: every engine imports heddle.metrics.record, which must stay cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from heddle.metrics.fairness import FairnessReport, UserService, WindowService, fairness
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

if TYPE_CHECKING:
    from heddle.metrics.format import format_summary, print_summary, summary_text
    from heddle.metrics.plots import plot_latency_cdfs, plot_sweep, plot_timeline

_LAZY = {
    "format_summary": "format",
    "print_summary": "format",
    "summary_text": "format",
    "plot_latency_cdfs": "plots",
    "plot_sweep": "plots",
    "plot_timeline": "plots",
}

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
    if name in _LAZY:
        module = importlib.import_module(f"heddle.metrics.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'heddle.metrics' has no attribute {name!r}")
