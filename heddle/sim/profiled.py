"""A cost model fit to measured step times of the real executor.

    step_time = c0 + c1 * prefill_tokens + c2 * decode_tokens + c3 * decode_context_tokens
                   + c4 * prefill_attention_pairs + c5 * sampled_rows + c6 * prefill_chunks
                   + c7 * prefill_step + c8 * prefill_step_decode_tokens
                   + c9 * decode_block_breaks
                   + sum_k c_k * max(0, tokens - k)          for the knots k of TOKEN_KNOTS
                   + c_g * constrained_rows
                   + host_constant + host_per_row * rows    (the engine's time around the step)
                   + host_per_new_request * new_prompts     (its add_request and first schedule)

fit by non-negative least squares on relative error (every coefficient >= 0, so predicted
time never falls when a step grows). The hinge terms make the time a convex piecewise-linear
function of the step's tokens: flat while the weights' memory traffic dominates, steeper once
the matmuls are compute-bound, as a CPU or GPU step is (a straight line through both regimes
over-predicts the small steps of a light load). `prefill_chunks` is the fixed cost of each
multi-token request (its own attention call, mask and gather in every layer).
`prefill_step` (1 when the step carries any prefill chunk) and `prefill_step_decode_tokens`
(its decode rows) price the layer path: a decode-only step runs the fused decode layers (three
C calls per layer), any step with a prompt chunk the eager layers (~1,000 torch ops per step),
whatever its number of chunks; the decode rows of such a step go through the eager ops too.
`decode_block_breaks` prices a decode row's block table spread over the pool (each block that
does not follow the one before it, heddle.sim.block_layout): the profile times its random
shapes on tables scattered over the pool to a random degree, as a running engine's are, and
checks the term on shapes timed both ways side by side (`.metadata.extra["scatter"]`).

The engine's own time around a step (schedule, update, output processing, the event loop) is
not in the executor's step time but is on the real clock: `host_constant` + `host_per_row` *
rows, measured apart (heddle.model.profiling_host: the real Engine and replay loop over an
executor that costs nothing) or, `--from-run`, fit to the recorded gaps between back-to-back
steps. `host_per_new_request` is what admitting a request costs the engine (add_request, its
first schedule), charged to the step with its first prompt chunk (a chunk with no computed
prefix: `new_prompts`); `wake` is the sleep's overshoot of an idle engine, charged to a step
that follows an idle gap.

A step that follows an idle wait also pays the profile's idle warm-up (heddle.sim.warmup),
measured by timing shapes after sleeps: `idle_time(gap)`.

The fit reports its error on held-out samples by kind of step (heddle.sim.step_error), and
the model knows the range of shapes it was measured on (`Coverage`): it counts the steps it
is asked about outside that range, which `heddle simulate` reports as a warning.

`constrained_rows` (c_g, seconds per sampling row under a grammar: its token-mask fill, apply
and advance on the host) is not fit: the profiled steps have no grammar, and the work does not
depend on the forward pass. `heddle profile` measures it directly on the model's tokenizer
(heddle.structured.cost.measure_row_cost) and stores it with the fitted coefficients; a
profile without it charges constrained rows nothing.
Saved as JSON with what was measured, where, and how well it predicts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from heddle.errors import HeddleError
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.nnls import nnls
from heddle.sim.step_error import step_errors
from heddle.sim.warmup import BACK_TO_BACK_S, IdleWarmup

TOKEN_KNOTS = (32, 128)
FEATURES = (
    "constant",
    "prefill_tokens",
    "decode_tokens",
    "decode_context_tokens",
    "prefill_attention_pairs",
    "sampled_rows",
    "prefill_chunks",
    "prefill_step",
    "prefill_step_decode_tokens",
    "decode_block_breaks",
    *(f"tokens_over_{k}" for k in TOKEN_KNOTS),
)
# Seconds per constrained sampling row: measured apart from the fit (see the module doc).
CONSTRAINED_ROWS = "constrained_rows"
# The engine's time around a step and an idle engine's wake: measured apart from the fit.
HOST_TERMS = ("host_constant", "host_per_row", "host_per_new_request", "wake")
FORMAT = "heddle-step-profile/1"

__all__ = [
    "CONSTRAINED_ROWS",
    "FEATURES",
    "HOST_TERMS",
    "Coverage",
    "FitReport",
    "ProfileMetadata",
    "ProfiledCostModel",
    "dispatch_names",
    "feature_names",
    "features",
    "fit_profile",
    "nnls",
]


def dispatch_names(dispatch_rows: Sequence[int]) -> tuple[str, ...]:
    """The terms of the executor's kernel switches: at each of `dispatch_rows` (a step of more
    rows leaves the weight-only int4/int8 kernels for the float path; quantization auto),
    `tokens_upto_k` = min(tokens, k) (the quantized kernels' steeper cost per row, flat after
    the switch) and `tokens_above_k` = 1 past it (the float path's higher fixed cost). Both
    non-negative, so the time bends down at the switch without ever falling."""
    return tuple(f"tokens_{kind}_{k}" for k in dispatch_rows for kind in ("upto", "above"))


def feature_names(dispatch_rows: Sequence[int] = ()) -> tuple[str, ...]:
    return (*FEATURES, *dispatch_names(dispatch_rows))


def _dispatch_rows_of(names: Sequence[str]) -> tuple[int, ...]:
    rows = set()
    for name in names:
        if name.startswith(("tokens_upto_", "tokens_above_")):
            k = name.rsplit("_", 1)[1]
            if not k.isdigit() or int(k) < 1:
                raise HeddleError(f"bad kernel-switch term {name!r}")
            rows.add(int(k))
    return tuple(sorted(rows))


def features(shape: StepShape, dispatch_rows: Sequence[int] = ()) -> tuple[float, ...]:
    """The regressors of one step, in `feature_names(dispatch_rows)` order."""
    tokens = shape.num_tokens
    switches = [v for k in dispatch_rows for v in (float(min(tokens, k)), float(tokens > k))]
    prefill_step = 1.0 if shape.prefill_chunks else 0.0
    return (
        1.0,
        float(shape.num_prefill_tokens),
        float(shape.num_decode_tokens),
        float(shape.decode_context_tokens),
        float(shape.prefill_attention_pairs),
        float(shape.num_sampled_rows),
        float(len(shape.prefill_chunks)),
        prefill_step,
        prefill_step * shape.num_decode_tokens,
        float(shape.decode_block_breaks),
        *(float(max(0, tokens - k)) for k in TOKEN_KNOTS),
        *switches,
    )


@dataclass(frozen=True, slots=True)
class Coverage:
    """The range of step shapes a profile was measured on."""

    max_tokens: int
    max_decode_tokens: int
    max_prefill_chunks: int
    max_context: int  # longest prefill chunk context, or mean decode context

    @classmethod
    def of(cls, shapes: Sequence[StepShape]) -> Coverage:
        return cls(
            max(s.num_tokens for s in shapes),
            max(s.num_decode_tokens for s in shapes),
            max(len(s.prefill_chunks) for s in shapes),
            max(_longest_context(s) for s in shapes),
        )

    def miss(self, shape: StepShape) -> str | None:
        """Why `shape` lies outside (the first reason), or None when it is covered."""
        if shape.num_tokens > self.max_tokens:
            return f"{shape.num_tokens} tokens > {self.max_tokens}"
        if shape.num_decode_tokens > self.max_decode_tokens:
            return f"{shape.num_decode_tokens} decodes > {self.max_decode_tokens}"
        if len(shape.prefill_chunks) > self.max_prefill_chunks:
            return f"{len(shape.prefill_chunks)} prefill chunks > {self.max_prefill_chunks}"
        if _longest_context(shape) > self.max_context:
            return f"context {_longest_context(shape)} > {self.max_context}"
        return None


def new_prompts(shape: StepShape) -> int:
    """The step's prompt chunks with nothing computed before them: a request's first chunk
    (a prefix-cache hit or a resumption is counted as continuing)."""
    return sum(1 for n, c in shape.prefill_chunks if n == c)


def _longest_context(shape: StepShape) -> int:
    num_decode = shape.num_decode_tokens
    decode = shape.decode_context_tokens // num_decode if num_decode else 0
    return max([decode, *(c for _, c in shape.prefill_chunks)])


# A fit's median |error| on its own shapes above this: the machine's speed moved while it was
# profiled (a quiet 2-core VM fits the profile's shapes to 3-5%; docs/BENCHMARKS.md section 4).
NOISY_FIT = 0.05


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fit predicts: on the samples it was fit to, and (`held_out`: bucket ->
    [steps, median |error|, p90 |error|, median signed error]) on samples it never saw."""

    num_samples: int
    median_abs_relative_error: float
    max_abs_relative_error: float
    rms_seconds: float
    num_held_out: int = 0
    held_out_median_abs: float | None = None
    held_out_p90_abs: float | None = None
    held_out: dict[str, list[float]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"fit over {self.num_samples} samples: median |error| "
            f"{100 * self.median_abs_relative_error:.1f}%, max "
            f"{100 * self.max_abs_relative_error:.1f}%"
        ]
        if self.median_abs_relative_error > NOISY_FIT:
            out.append(
                f"warning: the fit's median |error| is over {100 * NOISY_FIT:.0f}%: the "
                "machine's speed moved while it was profiled, and simulated figures will be "
                "off by about as much; profile again on a quiet machine"
            )
        if self.num_held_out and self.held_out_median_abs is not None:
            assert self.held_out_p90_abs is not None
            out.append(
                f"held out {self.num_held_out} samples: median |error| "
                f"{100 * self.held_out_median_abs:.1f}%, p90 {100 * self.held_out_p90_abs:.1f}%"
            )
            for name, (n, median, p90, signed) in self.held_out.items():
                out.append(
                    f"  {name:24s} {int(n):4d} steps  |error| p50 {100 * median:5.1f}% "
                    f"p90 {100 * p90:5.1f}%  signed {100 * signed:+5.1f}%"
                )
        return out


@dataclass(frozen=True, slots=True)
class ProfileMetadata:
    model: str | None = None
    dtype: str | None = None
    machine: str | None = None
    fit: FitReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    coverage: Coverage | None = None


class ProfiledCostModel(CostModel):
    def __init__(
        self,
        coefficients: dict[str, float],
        metadata: ProfileMetadata | None = None,
        warmup: IdleWarmup | None = None,
    ):
        self.dispatch_rows = _dispatch_rows_of(list(coefficients))
        names = feature_names(self.dispatch_rows)
        known = (*names, CONSTRAINED_ROWS, *HOST_TERMS)
        unknown = sorted(set(coefficients) - set(known))
        if unknown:
            raise HeddleError(f"unknown profile coefficients {unknown}; known: {list(FEATURES)}, "
                              f"{CONSTRAINED_ROWS}, {list(HOST_TERMS)} and tokens_upto_K / "
                              "tokens_above_K")  # fmt: skip
        if any(v < 0 for v in coefficients.values()):
            raise HeddleError(f"profile coefficients must be non-negative: {coefficients}")
        self.coefficients = {name: float(coefficients.get(name, 0.0)) for name in known}
        self.constrained_row_seconds = self.coefficients[CONSTRAINED_ROWS]
        self.host_constant, self.host_per_row, self.host_per_new_request, self.wake = (
            self.coefficients[n] for n in HOST_TERMS)  # fmt: skip
        self.metadata = metadata or ProfileMetadata()
        self.warmup = warmup
        self._weights = tuple(self.coefficients[name] for name in names)
        # The simulator follows the block tables only for a profile that prices their breaks.
        self.reads_block_breaks = self.coefficients["decode_block_breaks"] > 0
        self._coverage = self.metadata.coverage
        self.num_steps = 0  # steps predicted
        self.num_outside = 0  # of them, outside the profile's coverage
        self.first_outside: str | None = None

    def step_time(self, shape: StepShape) -> float:
        if shape.is_empty:
            return 0.0
        if self._coverage is not None:
            self.num_steps += 1
            miss = self._coverage.miss(shape)
            if miss is not None:
                self.num_outside += 1
                if self.first_outside is None:
                    self.first_outside = miss
        x = features(shape, self.dispatch_rows)
        time = sum(w * v for w, v in zip(self._weights, x, strict=True))
        if shape.num_constrained:
            time += self.constrained_row_seconds * shape.num_constrained
        return time + self.host_time(shape)

    def host_time(self, shape: StepShape) -> float:
        """The engine's time around the step, included in `step_time`."""
        time = self.host_constant + self.host_per_row * shape.num_requests
        if self.host_per_new_request:
            time += self.host_per_new_request * new_prompts(shape)
        return time

    def with_constrained_row_seconds(
        self, seconds: float, measured: dict[str, Any] | None = None
    ) -> ProfiledCostModel:
        """This profile with its per-constrained-row term set to `seconds`; `measured` (how it
        was measured) goes into the metadata's extra as `constrained_row`."""
        metadata = self.metadata
        if measured is not None:
            metadata = replace(metadata, extra={**metadata.extra, "constrained_row": measured})
        return ProfiledCostModel(
            {**self.coefficients, CONSTRAINED_ROWS: seconds}, metadata, self.warmup
        )

    def idle_time(self, gap: float | None) -> float:
        if gap is not None and gap <= BACK_TO_BACK_S:
            return 0.0
        return self.wake + (0.0 if self.warmup is None else self.warmup.time(gap))

    @property
    def charges_idle(self) -> bool:
        return self.wake > 0 or (self.warmup is not None and any(self.warmup.extra))

    def with_warmup(self, warmup: IdleWarmup | None) -> ProfiledCostModel:
        """The same step prices with another idle warm-up (None: none)."""
        return ProfiledCostModel(self.coefficients, self.metadata, warmup)

    def with_host(
        self, host_constant: float, host_per_row: float, host_per_new_request: float,
        wake: float, measured: dict[str, Any] | None = None,
    ) -> ProfiledCostModel:
        """This profile with the engine's time around a step, per new request and an idle
        engine's wake set; `measured` (how) goes into the metadata's extra as `host`."""
        metadata = self.metadata
        if measured is not None:
            metadata = replace(metadata, extra={**metadata.extra, "host": measured})
        values = (host_constant, host_per_row, host_per_new_request, wake)
        terms = dict(zip(HOST_TERMS, values, strict=True))
        return ProfiledCostModel({**self.coefficients, **terms}, metadata, self.warmup)

    def executor_only(self) -> ProfiledCostModel:
        """The executor's step alone, as `ExecutorOutput.step_duration` measures it: no idle
        warm-up, no wake, no engine time around the step (for per-step comparisons)."""
        return self.with_host(0.0, 0.0, 0.0, 0.0).with_warmup(None)

    def coverage_warning(self) -> str | None:
        """One line when some predicted steps lay outside what the profile measured."""
        if not self.num_outside:
            return None
        return (
            f"warning: {self.num_outside} of {self.num_steps} steps "
            f"({100 * self.num_outside / self.num_steps:.1f}%) fell outside the shapes the "
            f"profile measured (first: {self.first_outside}); their times are extrapolated: "
            "profile with the same --max-num-batched-tokens, --max-num-seqs and a larger "
            "--max-context"
        )

    def describe(self) -> str:
        m = self.metadata
        idle = ", idle warm-up" if self.warmup is not None and any(self.warmup.extra) else ""
        if self.host_constant or self.host_per_row:
            idle += ", engine time"
        return f"profiled({m.model or '?'} {m.dtype or '?'}, {m.machine or '?'}{idle})"

    def save(self, path: str | Path) -> None:
        data: dict[str, Any] = {
            "format": FORMAT,
            "coefficients": self.coefficients,
            "metadata": asdict(self.metadata),
        }
        if self.warmup is not None:
            data["idle_warmup"] = self.warmup.to_json()
        Path(path).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ProfiledCostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HeddleError(f"cannot read step profile {path}: {e}") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise HeddleError(f"{path} is not a heddle step profile (format {FORMAT!r})")
        try:
            meta = dict(data.get("metadata") or {})
            fit = meta.pop("fit", None)
            coverage = meta.pop("coverage", None)
            metadata = ProfileMetadata(
                **meta,
                fit=FitReport(**fit) if fit else None,
                coverage=Coverage(**coverage) if coverage else None,
            )
        except TypeError as e:
            raise HeddleError(f"{path}: malformed profile metadata: {e}") from e
        warmup = data.get("idle_warmup")
        return cls(data["coefficients"], metadata,
                   IdleWarmup.from_json(warmup) if warmup else None)  # fmt: skip


def _solve(
    samples: Sequence[tuple[StepShape, float]],
    dispatch_rows: Sequence[int] = (),
    without: Sequence[str] = (),
) -> np.ndarray:
    """Coefficients minimising the relative error over `samples` (non-negative); the terms
    named in `without` are held at zero."""
    times = np.array([t for _, t in samples], dtype=float)
    x = np.array([features(s, dispatch_rows) for s, _ in samples], dtype=float)  # [samples, f]
    names = feature_names(dispatch_rows)
    for name in without:
        x[:, names.index(name)] = 0.0
    weighted = x / times[:, None]
    # Columns scaled to unit norm so that token counts and attention pairs (orders of
    # magnitude apart) are conditioned alike; a feature never seen fits to zero.
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    result: np.ndarray = nnls(weighted / scale, np.ones(len(times))) / scale
    return result


def fit_profile(
    samples: Sequence[tuple[StepShape, float]],
    *,
    model: str | None = None,
    dtype: str | None = None,
    machine: str | None = None,
    extra: dict[str, Any] | None = None,
    held_out: float = 0.0,
    seed: int = 0,
    dispatch_rows: Sequence[int] = (),
    without: Sequence[str] = (),
) -> ProfiledCostModel:
    """Fit the coefficients to (shape, measured seconds) samples.

    Each row is divided by its measured time, so the fit minimises relative error: small
    decode steps count as much as large prefills. With `held_out` (a share, e.g. 0.25), that
    random share of the samples is first left out of a fit and predicted by it: the report's
    held-out errors, overall and per kind of step, are what to expect on shapes the profile
    never measured. The saved coefficients are then fit to every sample. `dispatch_rows`:
    the row counts where the executor switches kernels (`dispatch_names`). `without`: terms
    held at zero (to measure what a term is worth).
    """
    dispatch_rows = tuple(sorted({int(k) for k in dispatch_rows if k >= 1}))
    names = feature_names(dispatch_rows)
    unknown = sorted(set(without) - set(names))
    if unknown:
        raise HeddleError(f"cannot fit without unknown terms {unknown}; terms: {list(names)}")
    samples = [(s, t) for s, t in samples if not s.is_empty]
    if len(samples) < len(names):
        raise HeddleError(f"need at least {len(names)} non-empty samples, got {len(samples)}")
    if any(t <= 0 for _, t in samples):
        raise HeddleError("measured step times must be positive")
    if not 0.0 <= held_out < 1.0:
        raise HeddleError(f"held_out must be a share in [0, 1), got {held_out}")
    held: dict[str, list[float]] = {}
    held_median = held_p90 = None
    num_held = int(held_out * len(samples))
    if num_held and len(samples) - num_held >= len(names):
        order = list(range(len(samples)))
        random.Random(seed).shuffle(order)
        test = [samples[i] for i in order[:num_held]]
        train = [samples[i] for i in order[num_held:]]
        solved = _solve(train, dispatch_rows, without).tolist()
        partial = ProfiledCostModel(dict(zip(names, solved, strict=True)))
        report = step_errors(partial, test)
        held = {
            b.name: [b.num_steps, b.median_abs, b.p90_abs, b.median_signed]
            for b in report.buckets
        }
        held_median, held_p90 = report.overall.median_abs, report.overall.p90_abs
    else:
        num_held = 0
    coefficients = _solve(samples, dispatch_rows, without)
    times = np.array([t for _, t in samples], dtype=float)
    x = np.array([features(s, dispatch_rows) for s, _ in samples], dtype=float)
    predicted = x @ coefficients
    relative = np.abs(predicted - times) / times
    fit = FitReport(
        num_samples=len(times),
        median_abs_relative_error=float(np.median(relative)),
        max_abs_relative_error=float(relative.max()),
        rms_seconds=float(np.sqrt(np.mean((predicted - times) ** 2))),
        num_held_out=num_held,
        held_out_median_abs=held_median,
        held_out_p90_abs=held_p90,
        held_out=held,
    )
    metadata = ProfileMetadata(
        model, dtype, machine, fit, dict(extra or {}), Coverage.of([s for s, _ in samples])
    )
    return ProfiledCostModel(dict(zip(names, coefficients.tolist(), strict=True)), metadata)
