"""The profiled cost model: non-negative least squares, recovering known coefficients, JSON."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.errors import HeddleError
from heddle.model.profiling import profile_grid
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import FEATURES, ProfiledCostModel, features, fit_profile, nnls

TRUE = {
    "constant": 4e-3,
    "prefill_tokens": 60e-6,
    "decode_tokens": 90e-6,
    "decode_context_tokens": 20e-9,
    "prefill_attention_pairs": 1.5e-9,
    "sampled_rows": 30e-6,
}


def brute_force_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares on every subset of columns; the best non-negative solution wins."""
    best, best_residual = np.zeros(a.shape[1]), np.linalg.norm(b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x = np.zeros(a.shape[1])
            x[list(cols)] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            residual = np.linalg.norm(a @ x - b)
            if (x >= 0).all() and residual < best_residual - 1e-12:
                best, best_residual = x, residual
    return best


@pytest.mark.parametrize("seed", range(8))
def test_nnls_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((20, 5))
    b = rng.standard_normal(20)
    x = nnls(a, b)
    assert (x >= 0).all()
    np.testing.assert_allclose(x, brute_force_nnls(a, b), atol=1e-9)


def test_fit_recovers_known_coefficients_from_noisy_samples():
    rng = np.random.default_rng(0)
    shapes = profile_grid(max_num_batched_tokens=1024, max_num_seqs=128, max_context=8192)
    truth = ProfiledCostModel(TRUE)
    samples = [(s, truth.step_time(s) * (1 + 0.01 * rng.standard_normal())) for s in shapes]
    fitted = fit_profile(samples, model="m", dtype="bfloat16", machine="test")
    for name in FEATURES:
        assert fitted.coefficients[name] == pytest.approx(TRUE[name], rel=0.1), name
    fit = fitted.metadata.fit
    assert fit is not None and fit.num_samples == len(shapes)
    assert fit.median_abs_relative_error < 0.02


def test_fit_keeps_coefficients_non_negative():
    # Time that falls with decode tokens cannot be represented: that coefficient is clamped.
    shapes = [StepShape((), (100,) * b) for b in range(1, 40)]
    samples = [(s, 0.02 - 1e-4 * s.num_decode_tokens) for s in shapes]
    fitted = fit_profile(samples)
    assert all(v >= 0 for v in fitted.coefficients.values())
    assert fitted.coefficients["decode_tokens"] == 0.0


def test_save_and_load_round_trip(tmp_path):
    samples = [(s, ProfiledCostModel(TRUE).step_time(s)) for s in profile_grid()]
    fitted = fit_profile(
        samples, model="smollm2-135m", dtype="float32", machine="cpu-2core", extra={"repeats": 3}
    )
    path = tmp_path / "profile.json"
    fitted.save(path)
    loaded = ProfiledCostModel.load(path)
    assert loaded.coefficients == fitted.coefficients
    assert loaded.metadata == fitted.metadata
    assert loaded.describe() == "profiled(smollm2-135m float32, cpu-2core)"
    shape = StepShape(((64, 300),), (10, 20))
    assert loaded.step_time(shape) == fitted.step_time(shape)


def test_bad_profiles_are_clear_errors(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(HeddleError, match="not a heddle step profile"):
        ProfiledCostModel.load(path)
    with pytest.raises(HeddleError, match="cannot read"):
        ProfiledCostModel.load(tmp_path / "missing.json")
    with pytest.raises(HeddleError, match="non-negative"):
        ProfiledCostModel({"constant": -1.0})
    with pytest.raises(HeddleError, match="at least 6"):
        fit_profile([(StepShape((), (3,)), 0.1)])


def test_features_are_in_declared_order():
    shape = StepShape(((4, 10),), (7, 8), num_sampled=3)
    assert features(shape) == (1.0, 4.0, 2.0, 15.0, 4 * 6 + 10, 3.0)


shapes = st.builds(
    lambda p, d: StepShape(tuple(p), tuple(d)),
    st.lists(
        st.tuples(st.integers(2, 512), st.integers(0, 4096)).map(lambda c: (c[0], sum(c))),
        max_size=3,
    ),
    st.lists(st.integers(1, 8192), max_size=32),
)


@settings(max_examples=100, deadline=None)
@given(shapes, st.integers(1, 8192), st.integers(1, 1024))
def test_profiled_model_is_monotone(shape, context, extra):
    model = ProfiledCostModel(TRUE)
    more = StepShape(shape.prefill_chunks, (*shape.decode_context_lens, context))
    longer = StepShape(
        tuple((n, c + extra) for n, c in shape.prefill_chunks),
        tuple(c + extra for c in shape.decode_context_lens),
    )
    assert model.step_time(more) >= model.step_time(shape)
    assert model.step_time(longer) >= model.step_time(shape)
