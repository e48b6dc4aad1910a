"""A cost model fit to measured step times of the real executor.

    step_time = c0 + c1 * prefill_tokens + c2 * decode_tokens + c3 * decode_context_tokens
                   + c4 * prefill_attention_pairs + c5 * sampled_rows

fit by non-negative least squares on relative error (every coefficient >= 0, so predicted
time never falls when a step grows). Saved as JSON with what was measured, where, and how
well the fit matches its own samples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heddle.errors import HeddleError
from heddle.sim.cost_model import CostModel, StepShape

FEATURES = (
    "constant",
    "prefill_tokens",
    "decode_tokens",
    "decode_context_tokens",
    "prefill_attention_pairs",
    "sampled_rows",
)
FORMAT = "heddle-step-profile/1"


def features(shape: StepShape) -> tuple[float, ...]:
    """The regressors of one step, in `FEATURES` order."""
    return (
        1.0,
        float(shape.num_prefill_tokens),
        float(shape.num_decode_tokens),
        float(shape.decode_context_tokens),
        float(shape.prefill_attention_pairs),
        float(shape.num_sampled_rows),
    )


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fit reproduces the samples it was fit to (relative errors)."""

    num_samples: int
    median_abs_relative_error: float
    max_abs_relative_error: float
    rms_seconds: float


@dataclass(frozen=True, slots=True)
class ProfileMetadata:
    model: str | None = None
    dtype: str | None = None
    machine: str | None = None
    fit: FitReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ProfiledCostModel(CostModel):
    def __init__(self, coefficients: dict[str, float], metadata: ProfileMetadata | None = None):
        unknown = sorted(set(coefficients) - set(FEATURES))
        if unknown:
            raise HeddleError(f"unknown profile coefficients {unknown}; known: {list(FEATURES)}")
        if any(v < 0 for v in coefficients.values()):
            raise HeddleError(f"profile coefficients must be non-negative: {coefficients}")
        self.coefficients = {name: float(coefficients.get(name, 0.0)) for name in FEATURES}
        self.metadata = metadata or ProfileMetadata()
        self._weights = tuple(self.coefficients[name] for name in FEATURES)

    def step_time(self, shape: StepShape) -> float:
        if shape.is_empty:
            return 0.0
        return sum(w * x for w, x in zip(self._weights, features(shape), strict=True))

    def describe(self) -> str:
        m = self.metadata
        return f"profiled({m.model or '?'} {m.dtype or '?'}, {m.machine or '?'})"

    def save(self, path: str | Path) -> None:
        data = {
            "format": FORMAT,
            "coefficients": self.coefficients,
            "metadata": asdict(self.metadata),
        }
        Path(path).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ProfiledCostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HeddleError(f"cannot read step profile {path}: {e}") from e
        if data.get("format") != FORMAT:
            raise HeddleError(f"{path} is not a heddle step profile (format {FORMAT!r})")
        meta = dict(data.get("metadata") or {})
        fit = meta.pop("fit", None)
        metadata = ProfileMetadata(**meta, fit=FitReport(**fit) if fit else None)
        return cls(data["coefficients"], metadata)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set). a: [m, n], b: [m]."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 10 * n):
        gradient = a.T @ (b - a @ x)
        if passive.all() or gradient[~passive].max() <= tol:
            break
        passive[int(np.argmax(np.where(passive, -np.inf, gradient)))] = True
        for _ in range(n + 1):
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            # Step from x toward z until the first passive coefficient reaches zero.
            blocking = passive & (z <= 0)
            alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
    return x


def fit_profile(
    samples: Sequence[tuple[StepShape, float]],
    *,
    model: str | None = None,
    dtype: str | None = None,
    machine: str | None = None,
    extra: dict[str, Any] | None = None,
) -> ProfiledCostModel:
    """Fit the coefficients to (shape, measured seconds) samples.

    Each row is divided by its measured time, so the fit minimises relative error: small
    decode steps count as much as large prefills. Columns are scaled to unit norm before the
    solve so that token counts and attention pairs (which differ by orders of magnitude)
    are conditioned alike.
    """
    samples = [(s, t) for s, t in samples if not s.is_empty]
    if len(samples) < len(FEATURES):
        raise HeddleError(f"need at least {len(FEATURES)} non-empty samples, got {len(samples)}")
    times = np.array([t for _, t in samples], dtype=float)
    if (times <= 0).any():
        raise HeddleError("measured step times must be positive")
    x = np.array([features(s) for s, _ in samples], dtype=float)  # [samples, features]
    weighted = x / times[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0  # a feature never seen (e.g. no prefill samples) fits to zero
    coefficients = nnls(weighted / scale, np.ones(len(times))) / scale
    predicted = x @ coefficients
    relative = np.abs(predicted - times) / times
    report = FitReport(
        num_samples=len(times),
        median_abs_relative_error=float(np.median(relative)),
        max_abs_relative_error=float(relative.max()),
        rms_seconds=float(np.sqrt(np.mean((predicted - times) ** 2))),
    )
    metadata = ProfileMetadata(model, dtype, machine, report, dict(extra or {}))
    return ProfiledCostModel(dict(zip(FEATURES, coefficients.tolist(), strict=True)), metadata)
