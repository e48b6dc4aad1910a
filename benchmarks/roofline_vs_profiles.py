"""The roofline's linear-layer times against measured H100/A100 operator profiles.

    python benchmarks/roofline_vs_profiles.py [--max-tp 1] [--calibrate] [--png FILE]

The figure goes to results/roofline_vs_profiles.png unless --png names another file (the one in
docs/: `--png docs/figures/roofline_vs_profiles.png`).

Reads shared/gpu-profiles (beside the repository, or $HEDDLE_SHARED), predicts the fused QKV,
output, gate+up and down projections of Llama-2-7B/70B and Llama-3-8B from the shipped h100
and a100 specs, and prints the median absolute relative error per token-count bucket and
operator. --calibrate also searches the (compute, memory) efficiency pair per hardware (the
shipped specs hold its result at tp=1). Runs on a CPU in about 20 seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from heddle.sim.profiles_check import (
    OPERATOR_COLUMNS,
    Comparison,
    balanced_error,
    calibrate,
    compare,
    error_table,
    load_profiles,
    median_abs_error,
    profiles_dir,
)
from heddle.sim.specs import load_hardware_spec

HARDWARE = ("h100", "a100")
OPERATORS = tuple(OPERATOR_COLUMNS.values())


def print_table(hardware: str, comparisons: list[Comparison]) -> None:
    """Median |error| per bucket and operator; bias: the bucket's median signed error
    (negative: the roofline is too fast); n: (token count, operator) points in the bucket."""
    print(f"\n{hardware}: median |predicted - measured| / measured")
    print("| tokens | " + " | ".join(OPERATORS) + " | all | bias | n |")
    print("|---" * (len(OPERATORS) + 4) + "|")
    for (low, high), row in error_table(comparisons).items():
        errors = [c.relative_error for c in comparisons if low <= c.measured.num_tokens <= high]
        cells = " | ".join(f"{100 * row[op]:.0f}%" if op in row else "-" for op in OPERATORS)
        print(
            f"| {low}-{high} | {cells} | {100 * row['all']:.0f}% "
            f"| {100 * statistics.median(errors):+.0f}% | {len(errors)} |"
        )
    print(
        f"all rows: {100 * median_abs_error(comparisons):.1f}%, "
        f">= 64 tokens: {100 * median_abs_error(comparisons, 64):.1f}%, "
        f"bucket mean: {100 * balanced_error(comparisons):.1f}%"
    )


def plot(results: dict[str, list[Comparison]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(hw, c.measured.model.name) for hw, cs in results.items() for c in cs})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (hw, model) in zip(axes[0], panels, strict=True):
        for i, op in enumerate(OPERATORS):
            rows = sorted(
                (c.measured.num_tokens, c.measured.seconds * 1e3, c.predicted * 1e3)
                for c in results[hw]
                if c.measured.model.name == model
                and c.measured.operator == op
                and c.measured.tp == 1
            )
            tokens = [r[0] for r in rows]
            ax.scatter(tokens, [r[1] for r in rows], s=4, color=f"C{i}", label=f"{op} measured")
            ax.plot(tokens, [r[2] for r in rows], color=f"C{i}", lw=1, label=f"{op} roofline")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="tokens",
            ylabel="ms per layer",
            title=f"{model} on {hw}, tp=1",
        )
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\nwrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tp", type=int, default=1, help="include rows up to this tp")
    parser.add_argument("--calibrate", action="store_true", help="fit the efficiency factors")
    parser.add_argument("--png", type=Path, default=Path("results/roofline_vs_profiles.png"))
    args = parser.parse_args()
    directory = profiles_dir()
    if directory is None:
        print("no gpu-profiles: put shared/ beside the repository or set HEDDLE_SHARED")
        return 1
    results = {}
    for hw in HARDWARE:
        spec = load_hardware_spec(hw)
        measured = [m for m in load_profiles(directory, hw) if m.tp <= args.max_tp]
        if args.calibrate:
            best = calibrate(spec, measured, max_tp=args.max_tp)
            print(
                f"{hw}: calibrated compute_efficiency={best.compute_efficiency:.2f} "
                f"memory_efficiency={best.memory_efficiency:.2f} (shipped "
                f"{spec.compute_efficiency:.2f}, {spec.memory_efficiency:.2f})"
            )
        results[hw] = compare(spec, measured)
        print(
            f"{hw}: compute_efficiency={spec.compute_efficiency}, "
            f"memory_efficiency={spec.memory_efficiency}; tp <= {args.max_tp}; "
            f"models: {', '.join(sorted({m.model.name for m in measured}))}"
        )
        print_table(hw, results[hw])
    plot(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
