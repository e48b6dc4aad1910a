"""`heddle profile`: time the real executor over a grid of step shapes and fit a cost model.

The grid and the timing are heddle/model/profiling.py; the fit is heddle/sim/profiled.py. The
resulting JSON is what `heddle simulate --cost-model` reads.
"""

from __future__ import annotations

import argparse
import platform

from heddle.cli.flags import add_engine_arguments, engine_config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="profile.json", help="where to write the fitted model")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-context", type=int, default=2048)
    add_engine_arguments(p)


def run_from_args(args: argparse.Namespace) -> int:
    from heddle.model.executor import ModelExecutor
    from heddle.model.profiling import profile_executor, profile_grid
    from heddle.sim.profiled import fit_profile

    config = engine_config_from_args(args)
    executor = ModelExecutor(config.model, config.cache)
    shapes = profile_grid(
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_context=args.max_context,
        max_kv_tokens=executor.num_blocks * executor.block_size,
    )
    print(
        f"profiling {len(shapes)} step shapes x {args.repeats} "
        f"on {executor.model_name} ({executor.dtype})"
    )
    samples = profile_executor(
        executor.execute,
        shapes,
        executor.block_size,
        repeats=args.repeats,
        num_blocks=executor.num_blocks,
        vocab_size=executor.model_shape.vocab_size,
    )
    fitted = fit_profile(
        samples,
        model=executor.model_name,
        dtype=str(executor.dtype),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        extra={"num_blocks": executor.num_blocks, "block_size": executor.block_size},
    )
    fitted.save(args.output)
    fit = fitted.metadata.fit
    if fit is not None:
        print(
            f"fit over {fit.num_samples} samples: "
            f"median |error| {100 * fit.median_abs_relative_error:.1f}%, "
            f"max {100 * fit.max_abs_relative_error:.1f}%"
        )
    print(f"wrote {args.output}")
    return 0
