"""`heddle profile`: time the real executor on step shapes and fit a cost model, checked.

    heddle profile --output profile.json                  # grid corners + steps like real ones
    heddle profile --record-run run.json --workload chat --rate 2 --num-requests 30
    heddle profile --from-run run.json --output profile.json   # fit to your own traffic

The shapes and the timing are heddle/model/profiling.py; a real run's steps are logged by
heddle/model/step_log.py; the fit and its self-check (error on held-out shapes, per kind of
step) are heddle/sim/profiled.py. The resulting JSON is what `heddle simulate --cost-model`
reads; it records the range of shapes it measured, and the simulator warns outside it.
"""

from __future__ import annotations

import argparse
import math
import platform
from typing import Any

from heddle.cli.flags import add_engine_arguments, engine_config_from_args, parse_key_values
from heddle.errors import HeddleError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="profile.json", help="where to write the fitted model")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each shape (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each shape first")
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument(
        "--num-mixed", type=int, default=96,
        help="random steps like a running engine's (mixed prefill + decode, spread contexts) "
        "measured besides the grid's corners; 0: the grid only",
    )
    p.add_argument(
        "--held-out", type=float, default=0.25,
        help="share of the measured shapes left out of a fit to check it (0: no check)",
    )
    p.add_argument("--from-run", default=None, metavar="RUN.json",
                   help="fit to the steps of a recorded real run instead of timing shapes")
    p.add_argument("--record-run", default=None, metavar="RUN.json",
                   help="replay --workload on the real model and save its steps here")
    w = p.add_argument_group("workload of --record-run")
    w.add_argument("--workload", default="chat")
    w.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE")
    w.add_argument("--rate", type=float, default=1.0, help="requests/s")
    w.add_argument("--num-requests", type=int, default=30)
    add_engine_arguments(p)


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''}".strip()


def run_from_args(args: argparse.Namespace) -> int:
    if not 0.0 <= args.held_out < 1.0:
        raise HeddleError(f"--held-out must be in [0, 1), got {args.held_out}")
    if args.from_run:
        return _fit_from_run(args)
    from heddle.model.executor import ModelExecutor

    config = engine_config_from_args(args)
    executor = ModelExecutor(config.model, config.cache)
    if args.record_run:
        return _record_run(args, config, executor)
    return _profile(args, config, executor)


def _fit_and_save(args: argparse.Namespace, samples: list[Any], **metadata: Any) -> int:
    from heddle.sim.profiled import fit_profile

    fitted = fit_profile(samples, held_out=args.held_out, **metadata)
    fitted.save(args.output)
    if fitted.metadata.fit is not None:
        print("\n".join(fitted.metadata.fit.lines()))
    print(f"wrote {args.output}")
    return 0


def _profile(args: argparse.Namespace, config: Any, executor: Any) -> int:
    from heddle.model.profiling import profile_model

    scheduler = config.scheduler
    print(
        f"profiling the grid's corners and {args.num_mixed} mixed steps x {args.repeats} "
        f"on {executor.model_name} ({executor.dtype})"
    )
    fitted = profile_model(
        executor,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
        max_context=min(args.max_context, executor.max_model_len),
        num_mixed=args.num_mixed,
        repeats=args.repeats,
        warmup=args.warmup,
        held_out=args.held_out,
        seed=args.seed,
        machine=_machine(),
    )
    fitted.save(args.output)
    if fitted.metadata.fit is not None:
        print("\n".join(fitted.metadata.fit.lines()))
    print(f"wrote {args.output}")
    return 0


def _fit_from_run(args: argparse.Namespace) -> int:
    from heddle.model.step_log import load_steps

    steps, metadata = load_steps(args.from_run)
    print(f"fitting to {len(steps)} steps of {args.from_run}")
    return _fit_and_save(
        args,
        steps,
        model=metadata.get("model"),
        dtype=metadata.get("dtype"),
        machine=metadata.get("machine"),
        extra={k: v for k, v in metadata.items() if k not in {"model", "dtype", "machine"}}
        | {"source": str(args.from_run)},
    )


def _record_run(args: argparse.Namespace, config: Any, executor: Any) -> int:
    from heddle.clock import WallClock
    from heddle.engine.engine import Engine
    from heddle.engine.replay import replay
    from heddle.model.step_log import StepRecorder, save_steps
    from heddle.workloads import get_workload

    workload = get_workload(
        args.workload,
        seed=args.seed,
        num_requests=args.num_requests,
        rate=math.inf if args.rate is None else args.rate,
        **parse_key_values(args.workload_option, "--workload-option"),
    )
    recorder = StepRecorder(executor)
    engine = Engine(
        config,
        recorder,
        num_blocks=executor.num_blocks,
        clock=WallClock(),
        eos_token_id=executor.eos_token_id,
        max_model_len=executor.max_model_len,
        vocab_size=executor.model_shape.vocab_size,
    )
    result = replay(engine, workload, vocab_size=executor.model_shape.vocab_size)
    save_steps(
        args.record_run,
        recorder.steps,
        {
            "model": executor.model_name,
            "dtype": str(executor.dtype),
            "machine": _machine(),
            "workload": args.workload,
            "rate": args.rate,
            "num_requests": len(result.records),
            "num_blocks": executor.num_blocks,
            "block_size": executor.block_size,
        },
    )
    print(
        f"{len(result.records)} requests in {result.elapsed:.1f} s: "
        f"{len(recorder.steps)} steps saved to {args.record_run}"
    )
    return 0
