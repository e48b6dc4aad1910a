"""`heddle profile`: time the real executor on step shapes and fit a cost model, checked.

    heddle profile --output profile.json                  # grid corners + steps like real ones
    heddle profile --record-run run.json --workload chat --rate 2 --num-requests 30
    heddle profile --from-run run.json --output profile.json   # fit to your own traffic

The shapes and the timing are heddle/model/profiling.py (the idle warm-up: a few shapes after
sleeps, heddle/model/profiling_idle.py; from a run: the steps after idle gaps); a real run's
steps are logged by heddle/model/step_log.py; the fit and its self-check (error on held-out
shapes, per kind of step) are heddle/sim/profiled.py. The resulting JSON is what `heddle
simulate --cost-model` reads; it records the range of shapes it measured, and the simulator
warns outside it.
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
    p.add_argument(
        "--rounds", type=int, default=1,
        help="passes over all the shapes, each timing every shape (warm-up + repeats); a "
        "shape's price is the median of its passes, so a slow spell of the machine touches "
        "every shape alike; >1 also reports each pass's own fit",
    )
    p.add_argument(
        "--no-scatter-check", action="store_true",
        help="do not time the check of the block-layout term (a few shapes with tables in "
        "runs and scattered over the pool, side by side)",
    )
    p.add_argument(
        "--decode-runs", default="moving", choices=("moving", "known", "new"),
        help="how a shape's timed runs schedule its decodes: decoding on from one position to "
        "the next as a running engine's do (moving), re-computing one position (known), or "
        "as new requests each run (new)",
    )
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument(
        "--num-mixed", type=int, default=128,
        help="random steps like a running engine's (mixed prefill + decode, spread contexts) "
        "measured besides the grid's corners; 0: the grid only",
    )
    p.add_argument(
        "--held-out", type=float, default=0.25,
        help="share of the measured shapes left out of a fit to check it (0: no check)",
    )
    p.add_argument(
        "--idle-gaps", default="1,10,100,1000", metavar="MS,MS,...",
        help="idle gaps (ms) after which a few shapes are timed again, for the idle warm-up "
        "the simulator adds to a step after a wait; 'none': no warm-up",
    )
    p.add_argument(
        "--grammar-rows", type=int, default=8,
        help="grammar-constrained rows whose token-mask work (fill, apply, advance) is timed "
        "for the profile's per-constrained-row term; 0: not measured (charged nothing)",
    )
    p.add_argument("--grammar-repeats", type=int, default=64,
                   help="timed steps of that measurement (median)")
    p.add_argument(
        "--no-host", action="store_true",
        help="do not measure (or, --from-run, fit) the engine's time around a step and an idle "
        "engine's wake; the simulator then charges the executor's step alone",
    )
    p.add_argument(
        "--dispatch-rows", default=None, metavar="K,K,...",
        help="with --from-run: the row counts where the executor switched kernels (default: "
        "the log's metadata)",
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


def _idle_gaps(text: str) -> tuple[float, ...] | None:
    if text.strip().lower() == "none":
        return None
    try:
        gaps = tuple(sorted(float(g) / 1e3 for g in text.split(",")))
    except ValueError:
        raise HeddleError(f"--idle-gaps: comma-separated milliseconds, got {text!r}") from None
    from heddle.sim.warmup import BACK_TO_BACK_S

    if not gaps or gaps[0] <= BACK_TO_BACK_S or len(set(gaps)) != len(gaps):
        raise HeddleError(
            f"--idle-gaps: distinct gaps over {1e3 * BACK_TO_BACK_S:g} ms, got {text!r}"
        )
    return gaps


def run_from_args(args: argparse.Namespace) -> int:
    if not 0.0 <= args.held_out < 1.0:
        raise HeddleError(f"--held-out must be in [0, 1), got {args.held_out}")
    args.idle_gaps = _idle_gaps(args.idle_gaps)
    if args.grammar_rows < 0 or args.grammar_repeats < 1:
        raise HeddleError("--grammar-rows must be >= 0 and --grammar-repeats >= 1")
    if args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        raise HeddleError("--rounds and --repeats must be >= 1, --warmup >= 0")
    if args.from_run:
        return _fit_from_run(args)
    from heddle.model.executor import ModelExecutor

    config = engine_config_from_args(args)
    executor = ModelExecutor(config.model, config.cache)
    if args.record_run:
        return _record_run(args, config, executor)
    return _profile(args, config, executor)


def _report(fitted: Any, output: str) -> int:
    fitted.save(output)
    if fitted.metadata.fit is not None:
        print("\n".join(fitted.metadata.fit.lines()))
    print("\n".join(layout_lines(fitted.metadata.extra)))
    host = fitted.metadata.extra.get("host")
    if host:
        from heddle.model.profiling_host import HostProfile

        print("\n".join(HostProfile(**host).lines()))
    if fitted.warmup is not None:
        print("\n".join(fitted.warmup.lines()))
        check = fitted.metadata.extra.get("idle") or {}
        if "held_out_median_abs_with" in check:
            print(f"held-out steps after an idle gap: median |error| "
                  f"{100 * check['held_out_median_abs_with']:.1f}% with the warm-up, "
                  f"{100 * check['held_out_median_abs_without']:.1f}% without")  # fmt: skip
    print(f"wrote {output}")
    return 0


def layout_lines(extra: dict[str, Any]) -> list[str]:
    """The profile's block-layout check and its passes' fits, where it has them."""
    from heddle.model.profiling import round_lines
    from heddle.model.profiling_layout import scatter_lines

    out = scatter_lines(extra["scatter"]) if extra.get("scatter") else []
    return out + (round_lines(extra["rounds"]) if extra.get("rounds") else [])


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
        rounds=args.rounds,
        scatter_check=not args.no_scatter_check,
        decode_runs=args.decode_runs,
        held_out=args.held_out,
        seed=args.seed,
        machine=_machine(),
        idle_gaps=args.idle_gaps,
        engine_config=None if args.no_host else config,
    )
    if args.grammar_rows > 0:
        fitted = _with_grammar_term(args, executor, fitted)
    return _report(fitted, args.output)


def _with_grammar_term(args: argparse.Namespace, executor: Any, fitted: Any) -> Any:
    """`fitted` with its constrained_rows term measured on the executor's tokenizer."""
    if executor.tokenizer is None:
        raise HeddleError("--grammar-rows needs the model's tokenizer: pass --grammar-rows 0")
    from heddle.structured.cost import measure_row_cost

    cost = measure_row_cost(
        executor.tokenizer,
        executor.model_shape.vocab_size,
        rows=args.grammar_rows,
        repeats=args.grammar_repeats,
        seed=args.seed,
    )
    print(
        f"constrained row: {cost.per_row_s * 1e6:.1f} us (bitmask fill {cost.fill_s * 1e6:.0f}"
        f" + apply {cost.apply_s * 1e6:.0f} + advance {cost.accept_s * 1e6:.0f} us for "
        f"{cost.rows} rows, median of {cost.repeats})"
    )
    return fitted.with_constrained_row_seconds(cost.per_row_s, measured=cost.as_dict())


def _fit_from_run(args: argparse.Namespace) -> int:
    """Fit the step prices to the run's back-to-back steps (all of them when it has too few),
    then the idle warm-up to the steps after idle gaps, when the log has their gaps."""
    from heddle.model.step_log import load_step_gaps, load_steps
    from heddle.sim.profiled import FEATURES, fit_profile
    from heddle.sim.warmup import BACK_TO_BACK_S, fit_warmup_from_run

    steps, metadata = load_steps(args.from_run)
    gaps = load_step_gaps(args.from_run)
    print(f"fitting to {len(steps)} steps of {args.from_run}")
    back_to_back = [s for s, g in zip(steps, gaps, strict=True)
                    if g is not None and g <= BACK_TO_BACK_S]  # fmt: skip
    warm = args.idle_gaps is not None and len(back_to_back) >= 4 * len(FEATURES)
    extra = {k: v for k, v in metadata.items() if k not in {"model", "dtype", "machine"}}
    switches = metadata.get("dispatch_rows") or ()
    if args.dispatch_rows:
        try:
            switches = [int(k) for k in args.dispatch_rows.split(",")]
        except ValueError:
            raise HeddleError(f"--dispatch-rows: comma-separated row counts, got "
                              f"{args.dispatch_rows!r}") from None  # fmt: skip
    fitted = fit_profile(
        back_to_back if warm else steps,
        held_out=args.held_out,
        dispatch_rows=switches,
        model=metadata.get("model"),
        dtype=metadata.get("dtype"),
        machine=metadata.get("machine"),
        extra=extra | {"source": str(args.from_run)},
    )
    if warm and len(back_to_back) < len(steps) - 1:
        warmup, check = fit_warmup_from_run(fitted, steps, gaps, args.idle_gaps)
        fitted.metadata.extra["idle"] = check
        fitted = fitted.with_warmup(warmup)
    elif args.idle_gaps is not None:
        print("no idle warm-up: the log records too few idle gaps (an older log?)")
    if not args.no_host:
        fitted = _host_from_run(fitted, steps, gaps)
    return _report(fitted, args.output)


def _host_from_run(fitted: Any, steps: list[Any], gaps: list[float | None]) -> Any:
    """The engine's time around a step and per new request, fit to the log's gaps; the sleep's
    overshoot is not in a step log (an idle gap is the sleep and its overshoot), so the wake
    stays 0."""
    from heddle.model.profiling_host import HostProfile, host_from_run

    try:
        constant, per_row, error, used, per_new = host_from_run(steps, gaps)
    except HeddleError:
        print("no engine time around a step: the log records no back-to-back gaps")
        return fitted
    host = HostProfile(constant, per_row, per_new, 0.0, used, 0, error)
    return fitted.with_host(constant, per_row, per_new, 0.0, measured=host.as_dict())


def _record_run(args: argparse.Namespace, config: Any, executor: Any) -> int:
    from heddle.clock import WallClock
    from heddle.engine.engine import Engine
    from heddle.engine.replay import replay
    from heddle.model.profiling import dispatch_rows
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
        gaps=recorder.gaps,
        metadata={
            "model": executor.model_name,
            "dtype": str(executor.dtype),
            "machine": _machine(),
            "workload": args.workload,
            "rate": args.rate,
            "num_requests": len(result.records),
            "num_blocks": executor.num_blocks,
            "block_size": executor.block_size,
            "dispatch_rows": list(dispatch_rows(executor)),
        },
    )
    print(
        f"{len(result.records)} requests in {result.elapsed:.1f} s: "
        f"{len(recorder.steps)} steps saved to {args.record_run}"
    )
    return 0
