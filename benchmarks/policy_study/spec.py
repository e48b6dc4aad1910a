"""What the policy study runs: the policies, workloads with per-class SLOs, and the options
every experiment changes. Shared by the `sim` and `real` modes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

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
