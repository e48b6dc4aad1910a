"""What an admitted short request waits for under sustained overload with the shedder on
(issue 16, target 3; docs/POLICIES.md "Policies under sustained overload, with the shedder").

One point of benchmarks/steady_state.py (same engine, workload, SLOs and variants), run with a
recording shedder: at every admitted short request's arrival it notes the queue the policy puts
ahead of it, the free seats, whether the policy would let it evict a running request *and* the
preemption guard would allow it (and if not, why: the guard's budget, the victim still
recovering, or the policy's own rule, e.g. priority's aging), and how long ago the youngest
running request of a looser class arrived (the cheapest victim's age). After the run each
admitted short request gets its TTFT, and the arrival span is cut into `--windows` windows:
per window the short TTFT p99 and, for all short requests and for the slow ones (TTFT above
`--slow`), the mean of each of those.

    python benchmarks/overload_tail.py --workload reasoning --policy priority --variant shed \
        --load 3 --num-requests 30000 [--policy-options aging_seconds=1000]

Virtual time: deterministic, the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from steady_state import RESULTS, VARIANTS, WORKLOADS, _options, machine, make_workload

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.admission import SchedulerState, SLOAdmission
from heddle.engine.replay import replay
from heddle.request import Request
from heddle.sim.simulator import build_sim_engine


class RecordingShedder(SLOAdmission):
    """The SLO shedder, noting at each admitted request of `classes` what it will wait for."""

    def __init__(self, classes: Sequence[str], **options: Any) -> None:
        super().__init__(**options)
        self.watch = set(classes)
        self.seen: dict[str, dict[str, Any]] = {}

    def decide(self, request: Request, state: SchedulerState) -> Any:
        refusal = super().decide(request, state)
        if refusal is None and request.request_class in self.watch:
            self.seen[request.request_id] = self._note(request, state)
        return refusal

    def _note(self, request: Request, state: SchedulerState) -> dict[str, Any]:
        now, policy = state.now, state.policy
        target = self._target(request) or math.inf
        ahead = self._ahead(request, state)
        looser = [r for r in state.running if (self._target(r) or 0.0) > target]
        evict = "no running request"
        if state.running:
            victim = policy.choose_victim(state.running, now)
            if not policy.should_preempt_for(request, victim, now):
                evict = "policy"
            elif state.guard is not None and state.guard.why_not(victim, now) is not None:
                evict = str(state.guard.why_not(victim, now))
            else:
                evict = "yes"
        return {
            "t": now,
            "ahead": len(ahead),
            "ahead_looser": sum(1 for r in ahead if (self._target(r) or 0.0) > target),
            "free_seats": state.max_num_seqs - len(state.running),
            "looser_running": len(looser),
            "evict": evict,
            "youngest_looser_age": now - max(r.arrival_time for r in looser) if looser else None,
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = WORKLOADS[args.workload]
    workload = make_workload(spec, 0, args.load * spec.saturation, args.num_requests)
    variant = dict(VARIANTS[args.variant])
    options = {**variant.pop("admission_options", {})}
    if variant.pop("admission", None) != "slo":
        raise SystemExit(f"overload_tail: variant {args.variant!r} has no SLO shedder")
    scheduler = SchedulerConfig(
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        policy=args.policy,
        policy_options=dict(args.policy_options),
        **variant,
    )
    config = EngineConfig(cache=CacheConfig(block_size=16), scheduler=scheduler, seed=0)
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100")
    shedder = RecordingShedder(spec.short, **options)
    engine.scheduler.admission = shedder
    assert engine.vocab_size is not None
    result = replay(engine, workload, vocab_size=engine.vocab_size)
    records = {r.request_id: r for r in result.records}
    rows = []
    for rid, seen in shedder.seen.items():
        rec = records.get(rid)
        if rec is not None and rec.first_token_time is not None:
            rows.append({**seen, "ttft": rec.first_token_time - rec.arrival_time})
    span = max(r["t"] for r in rows)
    windows = []
    for i in range(args.windows):
        inside = [
            r for r in rows if span * i / args.windows <= r["t"] < span * (i + 1) / args.windows
        ]
        if not inside:
            continue
        slow = [r for r in inside if r["ttft"] > args.slow]
        windows.append(
            {
                "start": span * i / args.windows,
                "n": len(inside),
                "p99": _quantile([r["ttft"] for r in inside], 0.99),
                "slow": len(slow),
                "all": _means(inside),
                "slow_means": _means(slow),
            }
        )
    guard = engine.scheduler.preemption_guard.report()
    return {
        "args": {k: v for k, v in vars(args).items() if k != "output"},
        "machine": machine(),
        "num_preemptions": result.num_preemptions,
        "guard": guard,
        "windows": windows,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _means(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    if not rows:
        return {}
    out: dict[str, float | None] = {}
    for key in ("ahead", "ahead_looser", "free_seats", "looser_running", "youngest_looser_age"):
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = statistics.fmean(values) if values else None
    for reason in ("yes", "policy", "budget", "recovering"):
        out[f"evict_{reason}"] = sum(1 for r in rows if r["evict"] == reason) / len(rows)
    return out


def table(report: dict[str, Any]) -> str:
    header = (
        "| window start (s) | short requests | short TTFT p99 (s) | slow | can evict (all / slow) "
        "| refused: policy (all / slow) | refused: guard budget (all / slow) | queue ahead "
        "(all / slow) | free seats (slow) | youngest looser running, age (s) (all / slow) |"
    )
    lines = [header, "|" + "---|" * 10]

    def pair(w: dict[str, Any], key: str, fmt: str) -> str:
        a, s = w["all"].get(key), w["slow_means"].get(key)
        return " / ".join("-" if v is None else format(v, fmt) for v in (a, s))

    for w in report["windows"]:
        slow = w["slow_means"]
        lines.append(
            f"| {w['start']:.0f} | {w['n']} | {w['p99']:.3f} | {w['slow']} "
            f"| {pair(w, 'evict_yes', '.2f')} | {pair(w, 'evict_policy', '.2f')} "
            f"| {pair(w, 'evict_budget', '.2f')} | {pair(w, 'ahead', '.1f')} "
            f"| {'-' if not slow else format(slow['free_seats'], '.1f')} "
            f"| {pair(w, 'youngest_looser_age', '.1f')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="reasoning", choices=sorted(WORKLOADS))
    parser.add_argument("--policy", default="priority")
    parser.add_argument("--policy-options", type=_options, default=())
    parser.add_argument("--variant", default="shed", choices=sorted(VARIANTS))
    parser.add_argument("--load", type=float, default=3.0)
    parser.add_argument("--num-requests", type=int, default=10000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--slow", type=float, default=0.1, help="seconds: a slow short TTFT")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args)
    path = args.output or RESULTS / (
        f"tail_{args.workload}_{args.policy}_{args.variant}_{args.load:g}_{args.num_requests}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"<!-- {' '.join(sys.argv)}; {report['machine']} -->")
    print(f"preemptions {report['num_preemptions']}; guard {report['guard']}")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
