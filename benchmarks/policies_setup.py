"""What the policy experiments run: workloads with per-class SLOs, the policies with their
options, and the metrics of one run. Shared by the `sim` and `real` modes of
benchmarks/policies.py (not a script).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from heddle.metrics import ClassSummary, RequestRecord, StepStat, fairness, summarize
from heddle.workloads import Workload, get_workload

POLICIES = (
    "fcfs",
    "static",
    "priority",
    "slo",
    "sjf",
    "oracle",
    "mlfq",
    "fair",
    "lanes",
    "adaptive",
)
SIM_ONLY = frozenset({"oracle"})  # needs each request's true output length
TARGET_LOADS = (1.0, 1.2, 1.5, 2.0)  # the high loads (fractions of fcfs saturation) of the targets


@dataclass(frozen=True)
class ClassSpec:
    """What a request class is promised (SLO, seconds) and its priority (lower: more urgent)."""

    ttft: float
    tpot: float
    priority: int = 0


@dataclass(frozen=True)
class WorkloadSpec:
    """One experiment workload: the generator, its options, and per-class SLOs and priorities.

    `short_classes` are the latency-sensitive classes whose TTFT the targets are about.
    `probe_rate` (req/s) overloads fcfs, and `probe_requests` keep it backlogged for longer
    than its longest requests live, to measure its saturation throughput in steady state.
    """

    key: str
    generator: str
    options: Mapping[str, Any]
    classes: Mapping[str, ClassSpec]
    short_classes: tuple[str, ...]
    num_requests: int
    probe_rate: float
    probe_requests: int
    # Per-policy option overrides for this workload (see `policy_options`).
    tuning: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def make(self, seed: int, rate: float, num_requests: int | None = None) -> Workload:
        """The seeded workload at `rate` req/s, each request tagged with its class's SLO and
        priority. Arrivals and lengths come from separate streams: every rate replays the same
        requests."""
        n = self.num_requests if num_requests is None else num_requests
        base = get_workload(self.generator, seed=seed, num_requests=n, rate=rate, **self.options)
        requests = []
        for r in base.requests:
            spec = self.classes.get(r.request_class) or self.classes["*"]
            requests.append(
                replace(r, ttft_slo=spec.ttft, tpot_slo=spec.tpot, priority=spec.priority)
            )
        return Workload(base.name, base.params, base.seed, requests)


INTERACTIVE = ClassSpec(ttft=0.5, tpot=0.05)
BATCHY = ClassSpec(ttft=2.0, tpot=0.1, priority=1)

# GPU scale: Llama-3.1-8B on one H100 (roofline). Interactive requests: TTFT 0.5 s and TPOT
# 50 ms (20 tokens/s, faster than reading); long-document and reasoning requests: TTFT 2 s,
# TPOT 100 ms, and a lower priority for the `priority` policy.
SIM_WORKLOADS: dict[str, WorkloadSpec] = {
    "chat": WorkloadSpec("chat", "chat", {}, {"*": INTERACTIVE}, ("default",), 1000, 80.0, 1500),
    "long-prompt": WorkloadSpec(
        "long-prompt",
        "long-prompt-mix",
        {},
        {"short": INTERACTIVE, "long": BATCHY},
        ("short",),
        1000,
        probe_rate=60.0,
        probe_requests=1500,
    ),
    # length_scale 0.5: short answers ~40 tokens, reasoning 10-50x that (400-2000): the same
    # ratios at half the simulation cost. Reasoning requests live ~20 s, so it takes ~4,000
    # arrivals for the seats to fill with them as they do in steady state.
    "reasoning": WorkloadSpec(
        "reasoning",
        "reasoning-mix",
        {"length_scale": 0.5},
        {"short": INTERACTIVE, "reasoning": BATCHY},
        ("short",),
        4000,
        probe_rate=150.0,
        probe_requests=3000,
    ),
    "multi-tenant": WorkloadSpec(
        "multi-tenant",
        "multi-tenant",
        {},
        {"*": INTERACTIVE},
        ("user-1", "user-2", "user-3"),
        1000,
        probe_rate=80.0,
        probe_requests=1500,
    ),
}


# Options changed from a policy's defaults in every experiment, and why (docs/POLICIES.md):
# slo: a request past its TTFT deadline can no longer count for goodput, so it yields to those
# that still can at once (default: only after a further TTFT target, which under overload keeps
# serving requests that have already missed, exactly as fcfs does).
TUNING: dict[str, dict[str, Any]] = {"slo": {"late_factor": 0.0}}


def policy_options(policy: str, spec: WorkloadSpec) -> dict[str, Any]:
    """The options a policy runs with on a workload: the common tuning, then the workload's."""
    return {**TUNING.get(policy, {}), **spec.tuning.get(policy, {})}


# -- metrics of one run ---------------------------------------------------------------------
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
    fairness between users, step utilization, and (sjf) the predictor's accuracy."""
    summary = summarize(records)
    short = [r for r in records if r.request_class in short_classes]
    short_summary = summarize(short, duration=summary.duration) if short else None
    # The service gap between users who both had a request in the system throughout a window
    # (heddle.metrics.fairness), and the same between users who both had one *queued* (arrived,
    # not yet scheduled) throughout: the condition under which VTC bounds the gap.
    fair = fairness(records, window=FAIRNESS_WINDOW)
    queued = [replace(r, finish_time=r.first_scheduled_time or r.finish_time) for r in records]
    fair_queued = fairness(queued, window=FAIRNESS_WINDOW)
    out: dict[str, Any] = {
        "duration": summary.duration,
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
