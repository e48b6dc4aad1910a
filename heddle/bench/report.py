"""What a bench run leaves behind: a summary table, a JSON file and a PNG of latency CDFs."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heddle.bench.refusals import RefusalReport
from heddle.metrics import Summary, record_to_dict
from heddle.metrics.programs import ProgramRecord, ProgramSummary, format_program_summary
from heddle.metrics.record import RequestRecord
from heddle.workloads import WorkloadRequest


@dataclass(slots=True)
class BenchResult:
    config: dict[str, Any]  # the run's settings (base_url, workload, rate, concurrency, ...)
    workload: dict[str, Any]  # Workload.describe()
    records: list[RequestRecord]
    summary: Summary
    errors: dict[str, str] = field(default_factory=dict)  # request id -> what went wrong
    num_not_sent: int = 0
    wall_time: float = 0.0
    workload_requests: list[WorkloadRequest] = field(default_factory=list)  # as planned
    # Agent workloads: one record per program and their summary.
    program_records: list[ProgramRecord] = field(default_factory=list)
    programs: ProgramSummary | None = None
    # HTTP 429s, apart from errors: per class, and each refused request (heddle.bench.refusals)
    refusals: RefusalReport | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, with_records: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": self.config,
            "workload": self.workload,
            "wall_time": self.wall_time,
            "num_not_sent": self.num_not_sent,
            "summary": self.summary.to_dict(),
            "errors": self.errors,
        }
        if self.refusals is not None:
            out["refusals"] = self.refusals.to_dict()
            out["refused"] = self.refused
        if self.programs is not None:
            out["programs"] = self.programs.to_dict()
        if with_records:
            out["records"] = [record_to_dict(r) for r in self.records]
            if self.program_records:
                out["program_records"] = [asdict(p) for p in self.program_records]
        return _finite(out)


def _finite(value: Any) -> Any:
    """JSON has no inf or nan: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_outputs(result: BenchResult, output_dir: str | Path, label: str = "bench") -> list[Path]:
    """`<label>.json` (settings, summary, errors, every record) and `<label>_cdf.png`."""
    from heddle.metrics import plot_latency_cdfs

    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{label}.json"
    json_path.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    title = f"{result.config.get('workload')} @ {_load_label(result.config)}"
    png_path = plot_latency_cdfs(
        {label: result.records}, directory / f"{label}_cdf.png", title=title
    )
    return [json_path, png_path]


def _load_label(config: dict[str, Any]) -> str:
    parts = []
    if config.get("request_rate") is not None:
        parts.append(f"{config['request_rate']} req/s")
    if config.get("concurrency") is not None:
        parts.append(f"concurrency {config['concurrency']}")
    return ", ".join(parts) or "all at once"


def print_report(result: BenchResult, console: Any = None) -> None:
    from rich.console import Console

    from heddle.metrics import format_summary

    # Off a terminal rich assumes 80 columns, too narrow for the table: use a log's width.
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    title = f"{result.config.get('base_url')} — {result.config.get('workload')}"
    title += f" @ {_load_label(result.config)}"
    console.print(format_summary(result.summary, title))
    overall = result.summary.overall
    console.print(
        f"requests: {overall.num_completed} completed, {overall.num_failed} failed, "
        f"{result.num_not_sent} not sent; "
        f"output {overall.output_throughput:.1f} tok/s, "
        f"total {overall.total_token_throughput:.1f} tok/s; wall {result.wall_time:.1f} s"
    )
    if result.refusals is not None and result.refusals.overall.refusals:
        console.print(result.refusals.line(), highlight=False)
    if result.programs is not None:
        console.print(format_program_summary(result.programs), highlight=False)
    if result.errors:
        shown = list(result.errors.items())[:5]
        console.print(f"[red]{len(result.errors)} request(s) failed[/red], e.g.:")
        for request_id, error in shown:
            console.print(f"  {request_id}: {error}")
