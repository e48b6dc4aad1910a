"""Measure a real executor's step times over a grid of step shapes, for `fit_profile`.

`profile_grid()` chooses the shapes; `profile_executor()` turns each into a synthetic
`SchedulerOutput` (made-up token ids, blocks from a bump allocator), runs it through an
injected `execute_fn` and times it; `heddle.sim.profiled.fit_profile` turns the samples into a
cost model. It lives beside the model it measures, but imports no torch: the caller (`heddle
profile`, heddle/cli/profile.py) passes `ModelExecutor.execute`.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from heddle.clock import Clock, WallClock
from heddle.core.outputs import ExecutorOutput, NewRequest, OutputBuilder, SchedulerOutput
from heddle.errors import HeddleError
from heddle.request import SamplingParams
from heddle.sim.block_layout import BlockBreaks, scattered_tables
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel, fit_profile
from heddle.sim.warmup import DEFAULT_GAPS_S

ExecuteFn = Callable[[SchedulerOutput], ExecutorOutput]


def _powers_of_two(low: int, high: int) -> list[int]:
    values, v = [], low
    while v <= high:
        values.append(v)
        v *= 2
    return values


def profile_grid(
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 64,
    max_context: int = 4096,
    max_kv_tokens: int | None = None,
) -> list[StepShape]:
    """Step shapes that span what a scheduler with these limits produces.

    - prefill: chunks of 16..budget tokens (powers of two) after cached prefixes of
      0, 1/4 and 3/4 of `max_context`, half of them ending their prompt (one sampled row);
    - decode: batches of 1..max_num_seqs (powers of two) at contexts 128..max_context;
    - mixed: a decode batch plus a mid-prompt prefill chunk filling the rest of the budget.

    Shapes whose contexts add up to more than `max_kv_tokens` (the executor's KV pool in
    tokens) are left out.
    """
    if min(max_num_batched_tokens, max_num_seqs, max_context) < 2:
        raise HeddleError("profile_grid limits must be at least 2")
    shapes: list[StepShape] = []
    chunks = _powers_of_two(16, max_num_batched_tokens) or [max_num_batched_tokens]
    prefixes = sorted({0, max_context // 4, 3 * max_context // 4})
    for i, chunk in enumerate(chunks):
        for j, prefix in enumerate(prefixes):
            if chunk + prefix <= max_context:
                # Half the chunks end their prompt (one sampled row): a checkerboard keeps the
                # LM head's cost apart from the chunk size and the prefix.
                sampled = (i + j + 1) % 2
                shapes.append(StepShape(((chunk, prefix + chunk),), (), num_sampled=sampled))
    batches = [b for b in _powers_of_two(1, max_num_seqs) if b <= max_num_batched_tokens]
    contexts = sorted({min(c, max_context) for c in (128, 512, 2048, max_context)})
    for batch in batches:
        for context in contexts:
            shapes.append(StepShape((), (context,) * batch))
    for batch in batches[::2]:
        chunk = max_num_batched_tokens - batch
        if chunk < 2:
            continue
        for context in contexts[:: max(1, len(contexts) - 1)]:
            prefill_context = min(max_context, chunk + context)
            if prefill_context >= chunk:
                shapes.append(StepShape(((chunk, prefill_context),), (context,) * batch))
    if max_kv_tokens is not None:
        shapes = [s for s in shapes if _kv_tokens(s) <= max_kv_tokens]
    return shapes


def profile_shapes(
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 64,
    max_context: int = 4096,
    max_kv_tokens: int | None = None,
    *,
    num_shapes: int = 96,
    seed: int = 0,
) -> list[StepShape]:
    """Random step shapes like the ones a continuous-batching scheduler runs.

    Unlike the grid's corners (one prefill chunk, decode batches of one context length), a
    real step mixes decodes of different context lengths with zero to three prefill chunks of
    any size up to the token budget, after cached prefixes or not, some ending their prompt.
    Quarters: decode-only, mixed, mixed filling the token budget, and a light load's step (one
    new prompt of 2-64 tokens, ending it or not, beside 0-16 decodes of contexts up to 512:
    the step that gives a chat request at light load its first token). Batch sizes and
    lengths are log-uniform, so small steps (most of a light load) are sampled as often as
    big ones.
    """
    if min(max_num_batched_tokens, max_num_seqs, max_context) < 2:
        raise HeddleError("profile limits must be at least 2")
    rng = random.Random(seed)
    budget = max_num_batched_tokens

    def log_uniform(low: int, high: int) -> int:
        return min(high, int(low * (high / low) ** rng.random()))

    shapes: list[StepShape] = []
    attempts = 0
    while len(shapes) < num_shapes and attempts < 20 * num_shapes:
        attempts += 1
        kind = len(shapes) % 4
        seats = min(max_num_seqs, budget)
        if kind == 3:
            shape = _light_step(rng, budget, seats, max_context, log_uniform)
            if shape is not None and (max_kv_tokens is None or _kv_tokens(shape) <= max_kv_tokens):
                shapes.append(shape)
            continue
        batch = log_uniform(1, seats) if kind == 0 else rng.randint(0, log_uniform(1, seats)) // 2
        decode = tuple(log_uniform(2, max_context) for _ in range(batch))
        room = budget - batch
        chunks: list[tuple[int, int]] = []
        if kind and room >= 2:
            target = room if kind == 2 else log_uniform(2, room)
            for _ in range(rng.randint(1, 3)):
                left = target - sum(n for n, _ in chunks)
                if left < 2:
                    break
                n = min(max_context, left if rng.random() < 0.5 else log_uniform(2, left))
                prefix = 0 if rng.random() < 0.5 else log_uniform(1, max(1, max_context - n))
                chunks.append((n, min(max_context, n + prefix)))
        if not chunks and not decode:
            continue
        sampled = sum(1 for _ in chunks if rng.random() < 0.5) + len(decode)
        shape = StepShape(tuple(chunks), decode, num_sampled=sampled)
        if max_kv_tokens is None or _kv_tokens(shape) <= max_kv_tokens:
            shapes.append(shape)
    return shapes


def _light_step(
    rng: random.Random, budget: int, seats: int, max_context: int, log_uniform: Any
) -> StepShape | None:
    """One new prompt's chunk of 2-64 tokens beside 0-16 short decodes (None: no room)."""
    batch = rng.randint(0, log_uniform(1, min(16, seats - 1))) if seats > 1 else 0
    room = min(64, budget - batch, max_context)
    if room < 2:
        return None
    chunk = log_uniform(2, room)
    decode = tuple(log_uniform(16, min(512, max_context)) for _ in range(batch))
    ends = rng.random() < 0.5
    return StepShape(((chunk, chunk),), decode, num_sampled=batch + int(ends))


def _kv_tokens(shape: StepShape) -> int:
    return sum(c for _, c in shape.prefill_chunks) + shape.decode_context_tokens


def build_scheduler_output(
    shape: StepShape,
    step_id: int,
    block_size: int,
    num_blocks: int | None = None,
    vocab_size: int = 1000,
    request_prefix: str = "profile",
    decodes_of: int | None = None,
    decode_lag: int = 0,
    scatter: float = 0.0,
    layout_seed: int | None = None,
) -> SchedulerOutput:
    """A SchedulerOutput of `shape` with synthetic token ids and freshly allocated blocks.

    Blocks are handed out from 0 upward within the step (the K/V they hold is whatever the
    cache contains: only the timing matters). Sampling is greedy so garbage K/V cannot
    upset a sampler. `StepShape.from_scheduler_output` of the result equals `shape`.
    `decodes_of`: the id of an earlier step of the same shape whose decode rows the executor
    still holds; they are scheduled again as known requests (no `NewRequest`), as a running
    engine's decodes are, while the prefill chunks come as new requests.
    `decode_lag`: each decode row computes the token `decode_lag` positions before its
    shape's (at most down to the first): a shape's runs with lags k, k - 1, .., 0 decode on
    from one position to the next, as a running engine's decodes do; the blocks cover the
    shape's full context from the first run.
    `scatter` > 0 (needs `num_blocks`): the tables are drawn over the whole pool, each next
    block a jump with that probability (`heddle.sim.block_layout.scattered_tables`), the same
    tables for every run of the shape (seeded by `layout_seed`, else its first step's id); 0:
    blocks 0 upward.
    """
    if decode_lag < 0:
        raise HeddleError("decode_lag must be >= 0")
    if block_size < 1:
        raise HeddleError("block_size must be positive")
    params = SamplingParams(temperature=0.0, max_tokens=None)
    sampled_prefills = max(0, shape.num_sampled_rows - shape.num_decode_tokens)
    next_block = 0
    builder = OutputBuilder(step_id)
    tables: list[list[int]] = []
    if scatter:
        if num_blocks is None:
            raise HeddleError("scattered block tables need the pool's num_blocks")
        contexts = [c for _, c in shape.prefill_chunks] + list(shape.decode_context_lens)
        sizes = [-(-c // block_size) for c in contexts]
        if sum(sizes) > num_blocks:
            raise HeddleError(
                f"a step of {shape.num_requests} requests needs {sum(sizes)} KV blocks of "
                f"{block_size} tokens; the executor has {num_blocks}: shrink the grid"
            )
        seed = layout_seed if layout_seed is not None else (
            step_id if decodes_of is None else decodes_of)  # fmt: skip
        tables = scattered_tables(sizes, num_blocks, scatter, random.Random(seed))
        tables.reverse()  # popped in row order

    def add(index: int, num_new: int, context: int, prompt_len: int, sample: bool) -> None:
        nonlocal next_block
        num_blocks_needed = -(-context // block_size)
        if tables:
            table = tables.pop()
        else:
            table = list(range(next_block, next_block + num_blocks_needed))
            next_block += num_blocks_needed
        at = context - min(decode_lag, context - 1) if num_new == 1 else context
        if decodes_of is not None and num_new == 1:
            builder.add(f"{request_prefix}-{decodes_of}-{index}", at - 1, 1, sample,
                        num_prompt_tokens=prompt_len)  # fmt: skip
            return
        request_id = f"{request_prefix}-{step_id}-{index}"
        if sample and num_new == 1:  # the prompt ends just before the token it computes
            prompt_len = max(1, at - 1)
        known = prompt_len + max(0, at - prompt_len)  # the prompt, then any outputs
        new = NewRequest(
            request_id,
            [1 + i * 31 % (vocab_size - 1) for i in range(known)],
            prompt_len,
            table,
            params,
        )
        builder.add(
            request_id,
            at - num_new,
            num_new,
            sample,
            num_prompt_tokens=prompt_len,
            new_request=new,
        )

    for i, (num_new, context) in enumerate(shape.prefill_chunks):
        sample = i < sampled_prefills
        # A sampling chunk ends its prompt; any other chunk stops one token short of it.
        add(i, num_new, context, context if sample else context + 1, sample)
    offset = len(shape.prefill_chunks)
    for j, context in enumerate(shape.decode_context_lens):
        sample = j < shape.num_sampled_rows
        # A sampling token follows the prompt (or is its only token); any other is mid-prompt.
        add(offset + j, 1, context, max(1, context - 1) if sample else context + 1, sample)
    if num_blocks is not None and next_block > num_blocks:
        raise HeddleError(
            f"a step of {shape.num_requests} requests needs {next_block} KV blocks of "
            f"{block_size} tokens; the executor has {num_blocks}: shrink the grid"
        )
    return builder.build()


DECODE_RUNS = ("moving", "known", "new")


def profile_executor(
    execute_fn: ExecuteFn,
    shapes: Sequence[StepShape],
    block_size: int,
    repeats: int = 3,
    *,
    warmup: int = 1,
    num_blocks: int | None = None,
    vocab_size: int = 1000,
    clock: Clock | None = None,
    decode_runs: str = "moving",
    scatter: float | Sequence[float] = 0.0,
    rounds: int = 1,
    rounds_out: list[list[tuple[StepShape, float]]] | None = None,
) -> list[tuple[StepShape, float]]:
    """(shape, median seconds over `repeats` runs) for each shape, after `warmup` untimed runs.

    A shape's first run sends every row as a new request; its later runs schedule the decode
    rows again as requests the executor knows (a running engine's decodes are), the prefill
    chunks as new ones. `decode_runs`: "moving" (each run decodes the next position, as a
    running engine's decodes do: the first run starts `warmup + repeats - 1` tokens before
    the shape's contexts and the last is the shape), "known" (every run re-computes the
    shape's last position) or "new" (every run sends the decodes as new requests too). Each
    shape's requests are reported finished when it is done (chunks: after each run), so an
    executor that keeps per-request state drops it as in serving.
    `scatter` (one level, or one per shape): how far the shape's block tables are spread over
    the pool (`build_scheduler_output`); the sample's shape carries its decode rows' breaks
    (`StepShape.decode_block_breaks`, counted as the engine's StepRecorder counts them).
    `rounds` > 1: every shape is timed in each of `rounds` passes over all the shapes, and its
    sample is the median of the passes' medians, so a spell of the machine's speed touches
    every shape alike instead of the few timed in it; `rounds_out` receives each pass's
    samples.
    """
    if repeats < 1 or warmup < 0 or rounds < 1:
        raise HeddleError("repeats and rounds must be >= 1 and warmup >= 0")
    levels = [float(scatter)] * len(shapes) if isinstance(scatter, int | float) else list(scatter)
    if len(levels) != len(shapes):
        raise HeddleError(f"{len(levels)} scatter levels for {len(shapes)} shapes")
    if decode_runs not in DECODE_RUNS:
        raise HeddleError(f"decode_runs must be one of {', '.join(DECODE_RUNS)}, "
                          f"not {decode_runs!r}")  # fmt: skip
    clock = clock or WallClock()
    finished: list[str] = []
    step_id = 0
    tracker = BlockBreaks()
    passes: list[list[tuple[StepShape, float]]] = []
    for _ in range(rounds):
        results: list[tuple[StepShape, float]] = []
        for index, (shape, level) in enumerate(zip(shapes, levels, strict=True)):
            times = []
            first = step_id
            breaks = 0
            for run in range(warmup + repeats):
                known = run > 0 and decode_runs != "new"
                lag = warmup + repeats - 1 - run if decode_runs == "moving" else 0
                so = build_scheduler_output(shape, step_id, block_size, num_blocks,
                                            vocab_size, decodes_of=first if known else None,
                                            decode_lag=lag, scatter=level,
                                            layout_seed=index)  # fmt: skip
                so.finished_request_ids = finished
                breaks = tracker.step(so)
                start = clock.now()
                execute_fn(so)
                elapsed = clock.now() - start
                if run >= warmup:
                    times.append(elapsed)
                last = run == warmup + repeats - 1
                known_next = decode_runs != "new"  # the next run schedules these decodes again
                finished = [rid for rid, n in zip(so.request_ids, so.num_new_tokens,
                                                  strict=True)
                            if last or n > 1 or not known_next]  # fmt: skip
                step_id += 1
            results.append((shape.with_breaks(breaks) if breaks else shape,
                            statistics.median(times)))  # fmt: skip
        passes.append(results)
    if rounds_out is not None:
        rounds_out.extend(passes)
    if rounds == 1:
        return passes[0]
    return [(passes[0][i][0], statistics.median(p[i][1] for p in passes))
            for i in range(len(shapes))]  # fmt: skip


def round_report(passes: Sequence[Sequence[tuple[StepShape, float]]],
                 dispatch: Sequence[int], seed: int) -> dict[str, Any]:  # fmt: skip
    """Each pass's own fit (median |error| on its shapes) beside the fit to the passes'
    medians, and how far a shape's passes lie apart (median over shapes of max / min - 1)."""
    def fit_error(samples: Sequence[tuple[StepShape, float]]) -> float:
        fit = fit_profile(samples, dispatch_rows=dispatch, seed=seed).metadata.fit
        assert fit is not None
        return fit.median_abs_relative_error

    merged = [(p[0][0], statistics.median(q[1] for q in p)) for p in zip(*passes, strict=True)]
    spread = [max(t for _, t in p) / min(t for _, t in p) - 1 for p in zip(*passes, strict=True)]
    return {"rounds": len(passes), "fit_per_round": [fit_error(p) for p in passes],
            "fit_of_medians": fit_error(merged), "spread_median": statistics.median(spread)}


def round_lines(report: dict[str, Any]) -> list[str]:
    per = ", ".join(f"{100 * e:.1f}%" for e in report["fit_per_round"])
    return [f"{report['rounds']} passes over the shapes: each pass's own fit {per}; the fit to "
            f"their medians {100 * report['fit_of_medians']:.1f}% (median |error|); a shape's "
            f"passes {100 * report['spread_median']:.1f}% apart (median)"]  # fmt: skip


def dispatch_rows(executor: Any) -> tuple[int, ...]:
    """The row counts past which the executor's linears leave their weight-only kernels for
    the float path (quantization auto tunes them at load), over the layers a step's every
    token goes through (not the LM head, which sees the sampled rows); () when none switch."""
    linears = getattr(getattr(getattr(executor, "model", None), "linears", None), "built", ())
    rows = {
        int(layer.max_rows)
        for layer in linears
        if getattr(layer, "kind", "") != "lm_head"
        and getattr(layer, "small", None) is not None
        and getattr(layer, "large", None) is not None
        and 0 < layer.max_rows < 1 << 40
    }
    return tuple(sorted(rows))


def profile_model(
    executor: Any,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_context: int,
    num_mixed: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    held_out: float = 0.25,
    seed: int = 0,
    machine: str | None = None,
    idle_gaps: Sequence[float] | None = DEFAULT_GAPS_S,
    idle_repeats: int = 3,
    engine_config: Any = None,
    samples_out: list[tuple[StepShape, float]] | None = None,
    decode_runs: str = "moving",
    rounds: int = 1,
    scatter_check: bool = True,
) -> ProfiledCostModel:
    """Time `executor` (a ModelExecutor, or anything with its `execute`, `block_size`,
    `num_blocks`, `model_shape`, `model_name` and `dtype`) on the grid's corners plus
    `num_mixed` steps like a running engine's, and fit a cost model checked on a held-out
    share of them (its report: `.metadata.fit.lines()`). With `idle_gaps`, also time
    `idle_shapes` after sleeps of those seconds and fit the idle warm-up (its check:
    `.metadata.extra["idle"]`). With `engine_config` (the engine's config, its token budget and
    seats), also measure the engine's time around a step and an idle engine's wake
    (heddle.model.profiling_host; `.metadata.extra["host"]`). `samples_out` receives the
    timed (shape, seconds), the grid's first (`.metadata.extra["num_grid"]` of them).
    The grid's corners are timed on runs of consecutive blocks, the random steps on tables
    scattered over the pool to a random degree (uniform 0..1, a running engine's pools lie in
    between), so the fit prices a table's breaks (`decode_block_breaks`); `scatter_check`
    also times a few shapes both ways side by side and checks that term on them
    (`.metadata.extra["scatter"]`, heddle.model.profiling_layout). `rounds` > 1: every shape
    is timed in that many passes over all of them (`profile_executor`), and the report gives
    each pass's own fit beside the fit to their medians (`.metadata.extra["rounds"]`)."""
    limits = dict(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_context=max_context,
        max_kv_tokens=executor.num_blocks * executor.block_size,
    )
    shapes = profile_grid(**limits)
    num_grid = len(shapes)
    if num_mixed:
        shapes += profile_shapes(**limits, num_shapes=num_mixed, seed=seed)
    layout_rng = random.Random(seed + 7)
    levels = [0.0] * num_grid + [layout_rng.random() for _ in shapes[num_grid:]]
    passes: list[list[tuple[StepShape, float]]] = []
    samples = profile_executor(
        executor.execute,
        shapes,
        executor.block_size,
        repeats=repeats,
        warmup=warmup,
        num_blocks=executor.num_blocks,
        vocab_size=executor.model_shape.vocab_size,
        decode_runs=decode_runs,
        scatter=levels,
        rounds=rounds,
        rounds_out=passes,
    )
    if samples_out is not None:
        samples_out.extend(samples)
    extra: dict[str, Any] = {"num_grid": num_grid}
    scatter_pairs = None
    if scatter_check:
        from heddle.model.profiling_layout import profile_scatter, scatter_shapes

        scatter_pairs = profile_scatter(
            executor.execute, scatter_shapes(**limits), executor.block_size,
            executor.num_blocks, executor.model_shape.vocab_size, repeats=repeats)  # fmt: skip
    idle_warmup = None
    if idle_gaps:
        from heddle.model.profiling_idle import fit_idle, idle_shapes, profile_idle

        idle = profile_idle(
            executor.execute,
            idle_shapes(max_num_batched_tokens, max_num_seqs),
            executor.block_size,
            idle_gaps,
            idle_repeats,
            num_blocks=executor.num_blocks,
            vocab_size=executor.model_shape.vocab_size,
        )
        idle_warmup, extra["idle"] = fit_idle(idle, idle_gaps)
    switches = dispatch_rows(executor)
    fitted = fit_profile(
        samples,
        dispatch_rows=switches,
        model=executor.model_name,
        dtype=str(executor.dtype),
        machine=machine,
        extra={"num_blocks": executor.num_blocks, "block_size": executor.block_size,
               "num_shapes": len(shapes), "repeats": repeats, "warmup": warmup,
               "decode_runs": decode_runs, **limits,
               "dispatch_rows": list(switches), **extra},
        held_out=held_out,
        seed=seed,
    )
    fitted = fitted.with_warmup(idle_warmup)
    if scatter_pairs:
        from heddle.model.profiling_layout import scatter_check as check_scatter

        fitted.metadata.extra["scatter"] = check_scatter(fitted.executor_only(), scatter_pairs)
    if rounds > 1:
        fitted.metadata.extra["rounds"] = round_report(passes, switches, seed)
    if engine_config is not None:
        from heddle.model.profiling_host import profile_host

        host = profile_host(
            engine_config,
            num_blocks=executor.num_blocks,
            vocab_size=executor.model_shape.vocab_size,
            max_model_len=getattr(executor, "max_model_len", max_context),
            eos_token_id=getattr(executor, "eos_token_id", None),
            executor=executor,
            seed=seed,
        )
        fitted = fitted.with_host(host.host_constant, host.host_per_row,
                                  host.host_per_new_request, host.wake,
                                  measured=host.as_dict())  # fmt: skip
    return fitted
