"""How far a cost model's step times are from measured ones, by kind of step.

`bucket(shape)` names the kind of a step (decode-only / mixed / prefill-only, by batch size
and context); `step_errors(cost_model, samples)` gives the relative error per bucket and over
all. Used by the profiler's self-check on held-out shapes, by `heddle profile --from-run`,
and by benchmarks/sim_fidelity.py on the steps a real run recorded.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from heddle.sim.cost_model import CostModel, StepShape


def _size(n: int, edges: Sequence[int]) -> str:
    low = 1
    for edge in edges:
        if n <= edge:
            return f"{low}-{edge}" if low != edge else f"{edge}"
        low = edge + 1
    return f"{low}+"


def bucket(shape: StepShape) -> str:
    """'decode b=5-16 ctx<=512', 'mixed b=1-4 tok=129-256', 'prefill tok=17-64', ..."""
    batch = _size(shape.num_decode_tokens, (1, 4, 16))
    if not shape.prefill_chunks:
        mean_context = shape.decode_context_tokens / shape.num_decode_tokens
        context = next((f"ctx<={c}" for c in (256, 1024) if mean_context <= c), "ctx>1024")
        return f"decode b={batch} {context}"
    tokens = _size(shape.num_prefill_tokens, (16, 64, 128, 256, 512))
    if not shape.decode_context_lens:
        return f"prefill tok={tokens}"
    return f"mixed b={batch} tok={tokens}"


@dataclass(frozen=True, slots=True)
class BucketError:
    """Relative errors (predicted - measured) / measured of the steps in one bucket."""

    name: str
    num_steps: int
    median_abs: float  # median of |relative error|
    p90_abs: float
    median_signed: float  # median relative error: > 0 the model is slow, < 0 fast
    share_of_time: float  # this bucket's share of the measured seconds


@dataclass(frozen=True, slots=True)
class StepErrorReport:
    overall: BucketError
    buckets: list[BucketError]

    def lines(self) -> list[str]:
        rows = [self.overall, *self.buckets]
        width = max(len(r.name) for r in rows)
        header = f"{'n':>6s} {'|err| p50':>9s} {'p90':>6s} {'signed':>7s} {'time':>5s}"
        out = [f"{'steps':{width}s} {header}"]
        for r in rows:
            out.append(
                f"{r.name:{width}s} {r.num_steps:6d} {100 * r.median_abs:8.1f}% "
                f"{100 * r.p90_abs:5.1f}% {100 * r.median_signed:+6.1f}% "
                f"{100 * r.share_of_time:4.0f}%"
            )
        return out


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(name: str, errors: list[float], seconds: float, total: float) -> BucketError:
    absolute = [abs(e) for e in errors]
    return BucketError(
        name,
        len(errors),
        statistics.median(absolute),
        _quantile(absolute, 0.9),
        statistics.median(errors),
        seconds / total if total else 0.0,
    )


def step_errors(
    cost_model: CostModel, samples: Sequence[tuple[StepShape, float]]
) -> StepErrorReport:
    """Per-bucket and overall relative error of `cost_model` on measured (shape, seconds)."""
    samples = [(s, t) for s, t in samples if not s.is_empty and t > 0]
    if not samples:
        raise ValueError("no measured non-empty steps to compare against")
    total = sum(t for _, t in samples)
    by_bucket: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    everything: list[float] = []
    for shape, seconds in samples:
        error = (cost_model.step_time(shape) - seconds) / seconds
        errors, times = by_bucket[bucket(shape)]
        errors.append(error)
        times.append(seconds)
        everything.append(error)
    buckets = [
        _summary(name, errors, sum(times), total)
        for name, (errors, times) in sorted(by_bucket.items())
    ]
    return StepErrorReport(_summary("all", everything, total, total), buckets)
