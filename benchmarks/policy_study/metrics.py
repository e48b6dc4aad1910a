"""The numbers reported about one run of the policy study, from its records and step stats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from heddle.metrics import ClassSummary, RequestRecord, StepStat, fairness, summarize

FAIRNESS_WINDOW = 2.0  # seconds (engine clock)


def _latency(stats: Any, keys: Sequence[str]) -> dict[str, float | None]:
    return {k: getattr(stats, k) for k in keys}


def compact(c: ClassSummary) -> dict[str, Any]:
    """The numbers a report needs from one class summary (seconds, req/s, tokens/s)."""
    return {
        "num_requests": c.num_requests,
        "num_completed": c.num_completed,
        "num_unfinished": c.num_unfinished,
        "num_preemptions": c.num_preemptions,
        "request_throughput": c.request_throughput,
        "output_throughput": c.output_throughput,
        "total_token_throughput": c.total_token_throughput,
        "goodput": c.goodput,
        "num_within_slo": c.num_within_slo,
        "slo_attainment": c.slo_attainment,
        "ttft": _latency(c.ttft, ("mean", "p50", "p99")),
        "tpot": _latency(c.tpot, ("mean", "p50", "p99")),
        "e2e": _latency(c.e2e, ("mean", "p50", "p99")),
        "queue_time": _latency(c.queue_time, ("mean", "p99")),
        "stall_time": _latency(c.stall_time, ("mean", "p99")),
        "blocked_time": _latency(c.blocked_time, ("mean", "p99")),
    }


def run_metrics(
    records: Sequence[RequestRecord],
    steps: Sequence[StepStat],
    short_classes: Sequence[str],
    policy: Any = None,
) -> dict[str, Any]:
    """Everything reported about one run: overall, per class, the short classes together,
    fairness between users, step utilization, and (sjf) the predictor's accuracy. Throughputs
    and `goodput` divide by the run's span (`duration`: first arrival to last finish)."""
    summary = summarize(records)
    short = [r for r in records if r.request_class in short_classes]
    short_summary = summarize(short, duration=summary.duration) if short else None
    # The service gap between users who both had a request in the system throughout a window
    # (heddle.metrics.fairness), and the same between users who both had one *queued* (arrived,
    # not yet scheduled) throughout: the condition under which VTC bounds the gap.
    fair = fairness(records, window=FAIRNESS_WINDOW)
    queued = [replace(r, finish_time=r.first_scheduled_time or r.finish_time) for r in records]
    fair_queued = fairness(queued, window=FAIRNESS_WINDOW)
    arrivals = [r.arrival_time for r in records]
    out: dict[str, Any] = {
        "duration": summary.duration,
        # First to last arrival: the same for every policy at one load and seed (see
        # targets.common_window_goodput), unlike `duration`, the run's own span.
        "offered_window": max(arrivals) - min(arrivals) if arrivals else 0.0,
        "overall": compact(summary.overall),
        "classes": {name: compact(c) for name, c in summary.classes.items()},
        "short": compact(short_summary.overall) if short_summary else None,
        "fairness": {
            "max_service_difference": fair.max_service_difference,
            "max_difference_users": fair.max_difference_users,
            "num_windows_compared": fair.num_windows_compared,
            "window": fair.window,
            "jain_index": fair.jain_index,
            "queued_max_service_difference": fair_queued.max_service_difference,
            "queued_num_windows_compared": fair_queued.num_windows_compared,
        },
        "step_utilization": sum(s.utilization for s in steps) / len(steps) if steps else None,
        "num_steps": len(steps),
    }
    predictor = getattr(policy, "predictor", None)
    if predictor is not None:
        stats = predictor.stats()
        out["predictor"] = {
            "num_samples": stats.num_samples,
            "mean_abs_error": stats.mean_abs_error,
            "mean_rel_error": stats.mean_rel_error,
        }
    return out


def saturation_throughput(
    records: Sequence[RequestRecord], steps: Sequence[StepStat], mean_output_len: float
) -> dict[str, Any]:
    """Requests/s a policy sustains when always backlogged: output tokens per second over the
    second half of the time the waiting queue was non-empty (every seat busy, past the warm-up
    in which long requests accumulate), divided by the workload's mean output length.

    A run too small to queue anything (a smoke test) is measured over the whole run and flagged
    `backlogged: False`: a lower bound, not a saturation throughput.
    """
    backlogged = [s for s in steps if s.num_waiting > 0]
    window = backlogged or list(steps)
    start = window[0].start_time
    end = window[-1].start_time + window[-1].duration
    middle = (start + end) / 2 if backlogged else start
    tokens = sum(1 for r in records for t in r.token_times if middle < t <= end)
    tokens_per_s = tokens / (end - middle)
    return {
        "requests_per_s": tokens_per_s / mean_output_len,
        "output_tokens_per_s": tokens_per_s,
        "window": (middle, end),
        "backlogged": bool(backlogged),
    }
