from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from heddle.metrics import (
    SLO,
    StepStat,
    SweepPoint,
    format_summary,
    plot_latency_cdfs,
    plot_sweep,
    plot_timeline,
    print_summary,
    records_from_jsonl,
    records_to_jsonl,
    steps_from_jsonl,
    steps_to_jsonl,
    summarize,
    summary_text,
)

from .factories import make_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sample_records() -> list:
    out = []
    for i in range(12):
        t0 = i * 0.1
        cls = "short" if i % 3 else "long"
        tokens = [t0 + 0.2 + 0.05 * k for k in range(4 if cls == "short" else 2)]
        out.append(
            make_record(
                f"r{i}",
                t0,
                t0 + 0.05,
                tokens,
                tokens[-1],
                request_class=cls,
                user=f"u{i % 2}",
                num_preemptions=i % 5 == 0,
            )
        )
    out.append(make_record("bad", 0.0, None, [], 0.3, reason="error", request_class="short"))
    return out


def sample_steps() -> list[StepStat]:
    return [
        StepStat(
            i,
            i * 0.02,
            0.02,
            16 if i < 3 else 0,
            4,
            4,
            2,
            10 + i,
            64,
            [f"r{j}" for j in range(i % 4 + 1)],
            32,
        )
        for i in range(20)
    ]


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


def test_format_summary_table() -> None:
    summary = summarize(sample_records(), slo=SLO(ttft=0.25))
    text = summary_text(summary, title="run")
    assert "run" in text and "TTFT p50" in text and "goodput" in text
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert {"long", "short", "all"} <= set(lines)
    assert "(1 failed)" in lines["short"]
    assert format_summary(summary).row_count == 3
    buffer = io.StringIO()
    print_summary(summarize(sample_records()), console=Console(file=buffer, width=200))
    assert "goodput" not in buffer.getvalue() and "short" in buffer.getvalue()


def test_records_jsonl_round_trip(tmp_path: Path) -> None:
    rs = sample_records()
    rs[0].ttft_slo = 0.5
    rs[1].stall_time = 0.125
    path = tmp_path / "records.jsonl"
    records_to_jsonl(rs, path)
    assert records_from_jsonl(path) == rs
    steps = sample_steps()
    steps_to_jsonl(steps, tmp_path / "steps.jsonl")
    assert steps_from_jsonl(tmp_path / "steps.jsonl") == steps


def test_plot_latency_cdfs(tmp_path: Path) -> None:
    rs = sample_records()
    one = plot_latency_cdfs({"fcfs": rs}, tmp_path / "one.png")  # lines per class
    two = plot_latency_cdfs({"fcfs": rs, "sjf": rs[:5]}, tmp_path / "sub" / "two.png")
    empty = plot_latency_cdfs({"none": []}, tmp_path / "empty.png")
    assert is_png(one) and is_png(two) and is_png(empty)


def test_plot_timeline(tmp_path: Path) -> None:
    assert is_png(plot_timeline(sample_steps(), tmp_path / "timeline.png", title="steps"))
    assert is_png(plot_timeline([], tmp_path / "empty.png"))


def test_plot_sweep(tmp_path: Path) -> None:
    points = []
    for series in ("fcfs", "vtc"):
        for load in (1.0, 2.0, 4.0):
            records = sample_records()
            points.append(SweepPoint.from_summary(series, load, summarize(records)))
    assert points[0].request_throughput == summarize(sample_records()).overall.request_throughput
    assert points[0].to_dict()["series"] == "fcfs"
    assert is_png(plot_sweep(points, tmp_path / "sweep.png"))
