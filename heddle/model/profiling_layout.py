"""The profile's check of its block-layout term: the same step shapes timed with their block
tables in runs of consecutive blocks (a fresh pool) and scattered over the pool (a pool churned
by a long-running engine), side by side, against what the fitted model says the scatter costs.

`scatter_shapes()` picks decode and mixed shapes of a spread of contexts inside the engine's
limits; `profile_scatter()` times each one both ways, the two layouts alternating over
`rounds` (so a drift of the machine's speed touches both alike); `scatter_check()` compares
each shape's measured scattered / contiguous ratio with the model's and sums them up per kind
of step (heddle.sim.step_error.bucket); `scatter_lines()` prints that. The pairs are not in the
fit: they check the `decode_block_breaks` term on steps it never saw. Torch-free.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from heddle.model.profiling import ExecuteFn, profile_executor
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.step_error import bucket

# (decode rows, context) of the decode shapes, and (chunk, decode rows, context) of the mixed.
DECODES = ((1, 128), (1, 400), (4, 256), (16, 256), (8, 1024), (32, 512))
MIXED = ((64, 4, 256), (128, 8, 512))


def scatter_shapes(max_num_batched_tokens: int, max_num_seqs: int, max_context: int,
                   max_kv_tokens: int) -> list[StepShape]:  # fmt: skip
    """The decode and mixed shapes of DECODES and MIXED that fit the limits."""
    seats = min(max_num_seqs, max_num_batched_tokens)
    shapes = [StepShape((), (c,) * b) for b, c in DECODES if b <= seats and c <= max_context]
    for chunk, b, c in MIXED:
        if b + 1 <= max_num_seqs and chunk + b <= max_num_batched_tokens and c <= max_context:
            shapes.append(StepShape(((chunk, chunk),), (c,) * b, num_sampled=b + 1))
    # Room for both layouts' blocks is not needed (one shape runs at a time), only one's.
    return [s for s in shapes
            if sum(c for _, c in s.prefill_chunks) + s.decode_context_tokens
            <= max_kv_tokens // 2]  # fmt: skip


def profile_scatter(
    execute_fn: ExecuteFn,
    shapes: Sequence[StepShape],
    block_size: int,
    num_blocks: int,
    vocab_size: int,
    *,
    repeats: int = 3,
    rounds: int = 2,
) -> list[tuple[tuple[StepShape, float], tuple[StepShape, float]]]:
    """((contiguous shape, seconds), (scattered shape with its breaks, seconds)) per shape,
    each the median over `rounds` alternations of the profile's timing (moving decodes)."""
    contiguous: list[list[float]] = [[] for _ in shapes]
    scattered: list[list[float]] = [[] for _ in shapes]
    broken: list[StepShape] = list(shapes)
    for _ in range(rounds):
        for i, shape in enumerate(shapes):
            for level, out in ((0.0, contiguous), (1.0, scattered)):
                ((timed_shape, seconds),) = profile_executor(
                    execute_fn, [shape], block_size, repeats, num_blocks=num_blocks,
                    vocab_size=vocab_size, scatter=level)  # fmt: skip
                out[i].append(seconds)
                if level:
                    broken[i] = timed_shape
    both = zip(shapes, broken, contiguous, scattered, strict=True)
    return [((shape, statistics.median(c)), (b, statistics.median(s)))
            for shape, b, c, s in both]  # fmt: skip


def scatter_check(
    model: CostModel,
    pairs: Sequence[tuple[tuple[StepShape, float], tuple[StepShape, float]]],
) -> dict[str, Any]:
    """Per shape and per kind of step: the measured scattered / contiguous ratio and the
    model's, and the model's error on the scattered steps."""
    rows: list[dict[str, Any]] = []
    for (plain, t_plain), (broken, t_broken) in pairs:
        p_plain, p_broken = model.step_time(plain), model.step_time(broken)
        rows.append(
            {
                "bucket": bucket(plain),
                "decodes": plain.num_decode_tokens,
                "context": plain.decode_context_tokens // max(1, plain.num_decode_tokens),
                "breaks": broken.decode_block_breaks,
                "contiguous_s": t_plain,
                "scattered_s": t_broken,
                "measured_ratio": t_broken / t_plain,
                "model_ratio": p_broken / p_plain,
                "error_scattered": (p_broken - t_broken) / t_broken,
                "error_contiguous": (p_plain - t_plain) / t_plain,
            }
        )
    buckets: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault(row["bucket"], []).append(row)
    keys = ("measured_ratio", "model_ratio", "error_scattered", "error_contiguous")
    summary = {
        name: {key: statistics.median(r[key] for r in group) for key in keys}
        for name, group in sorted(buckets.items())
    }
    return {"shapes": rows, "buckets": summary}


def scatter_lines(check: dict[str, Any]) -> list[str]:
    """The check, one line per kind of step."""
    out = ["block tables scattered over the pool vs in runs (the same shapes side by side; "
           "not in the fit):"]  # fmt: skip
    for name, b in check.get("buckets", {}).items():
        out.append(
            f"  {name:24s} scattered / runs: measured {b['measured_ratio']:.3f}, model "
            f"{b['model_ratio']:.3f}; model's error scattered {100 * b['error_scattered']:+5.1f}%"
            f", in runs {100 * b['error_contiguous']:+5.1f}%"
        )
    return out
