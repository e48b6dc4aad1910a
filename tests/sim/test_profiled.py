"""The profiled cost model: non-negative least squares, recovering known coefficients, JSON."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.errors import HeddleError
from heddle.model.profiling import profile_grid, profile_shapes
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import (
    FEATURES,
    Coverage,
    ProfiledCostModel,
    features,
    fit_profile,
    nnls,
)

TRUE = {
    "constant": 4e-3,
    "prefill_tokens": 60e-6,
    "decode_tokens": 90e-6,
    "decode_context_tokens": 20e-9,
    "prefill_attention_pairs": 1.5e-9,
    "sampled_rows": 30e-6,
    "prefill_chunks": 1e-3,
    "prefill_step": 2.5e-3,  # the eager layers of a step with a prompt chunk
    "prefill_step_decode_tokens": 50e-6,
    "tokens_over_32": 20e-6,
    "tokens_over_128": 40e-6,
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
    limits = dict(max_num_batched_tokens=1024, max_num_seqs=128, max_context=8192)
    shapes = profile_grid(**limits) + profile_shapes(**limits, num_shapes=150)
    truth = ProfiledCostModel(TRUE)
    samples = [(s, truth.step_time(s) * (1 + 0.01 * rng.standard_normal())) for s in shapes]
    fitted = fit_profile(samples, model="m", dtype="bfloat16", machine="test", held_out=0.25)
    c = fitted.coefficients
    # Every decode row samples, so only the sum of these two is pinned down by the data.
    pairs = {"decode_tokens + sampled_rows": ("decode_tokens", "sampled_rows")}
    for name in FEATURES:
        if name not in pairs["decode_tokens + sampled_rows"]:
            assert c[name] == pytest.approx(TRUE.get(name, 0.0), rel=0.1, abs=2e-6), name
    assert c["decode_tokens"] + c["sampled_rows"] == pytest.approx(120e-6, rel=0.05)
    fit = fitted.metadata.fit
    assert fit is not None and fit.num_samples == len(shapes)
    assert fit.median_abs_relative_error < 0.02
    # The self-check: a quarter of the samples predicted by a fit that never saw them.
    assert fit.num_held_out == len(shapes) // 4
    assert fit.held_out_median_abs is not None and fit.held_out_median_abs < 0.02
    assert sum(n for n, *_ in fit.held_out.values()) == fit.num_held_out
    fresh = profile_shapes(**limits, num_shapes=50, seed=1)
    assert max(abs(fitted.step_time(s) / truth.step_time(s) - 1) for s in fresh) < 0.05


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
    with pytest.raises(HeddleError, match=f"at least {len(FEATURES)}"):
        fit_profile([(StepShape((), (3,)), 0.1)])


def test_features_are_in_declared_order():
    shape = StepShape(((4, 10),), (7, 8), num_sampled=3)
    # 6 tokens in all: under both knots of the token hinges.
    assert features(shape) == (1.0, 4.0, 2.0, 15.0, 4 * 6 + 10, 3.0, 1.0, 1.0, 2.0, 0.0, 0.0,
                               0.0)  # fmt: skip
    assert features(shape.with_breaks(5))[9] == 5.0  # the decode rows' table breaks
    # A decode-only step runs the fused layers: no prefill-step terms.
    assert features(StepShape((), (7, 8)))[7:9] == (0.0, 0.0)
    big = StepShape(((200, 300),), (7,) * 10)
    assert features(big)[-5:] == (1.0, 10.0, 0.0, 210.0 - 32, 210.0 - 128)


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


def test_profile_knows_what_it_covered_and_counts_steps_outside():
    samples = [(s, ProfiledCostModel(TRUE).step_time(s)) for s in profile_grid(256, 16, 1024)]
    fitted = fit_profile(samples)
    assert fitted.metadata.coverage == Coverage(256, 16, 1, 1024)
    fitted.step_time(StepShape(((100, 900),), (500,) * 8))
    assert fitted.coverage_warning() is None
    fitted.step_time(StepShape(((32, 32), (32, 32)), (10,)))
    fitted.step_time(StepShape((), (2000,)))
    warning = fitted.coverage_warning()
    assert warning is not None and "2 of 3 steps" in warning
    assert "first: 2 prefill chunks > 1" in warning
    assert Coverage(256, 16, 1, 1024).miss(StepShape((), (5,) * 17)) == "17 decodes > 16"
    assert Coverage(256, 16, 1, 1024).miss(StepShape(((250, 250),), (5,) * 7)) == (
        "257 tokens > 256"
    )


def test_held_out_check_and_coverage_survive_save_and_load(tmp_path):
    shapes = profile_grid(256, 16, 1024) + profile_shapes(256, 16, 1024, num_shapes=40)
    fitted = fit_profile([(s, ProfiledCostModel(TRUE).step_time(s)) for s in shapes],
                         held_out=0.25)  # fmt: skip
    fitted.save(tmp_path / "p.json")
    loaded = ProfiledCostModel.load(tmp_path / "p.json")
    assert loaded.metadata == fitted.metadata
    assert loaded.metadata.fit is not None
    assert any(line.startswith("held out") for line in loaded.metadata.fit.lines())


def test_kernel_switch_terms_fit_a_step_time_that_bends_down_at_the_switch(tmp_path):
    # Weight-only kernels cost 1 ms per row up to 8 rows; past 8 the float path is flat (+2 ms).
    truth = ProfiledCostModel(TRUE | {"tokens_upto_8": 1e-3, "tokens_above_8": 2e-3})
    assert truth.dispatch_rows == (8,)
    decode = [StepShape((), (100,) * b) for b in range(1, 17)]
    samples = [(s, truth.step_time(s)) for s in decode + profile_shapes(64, 16, 512, num_shapes=60)]
    fitted = fit_profile(samples, dispatch_rows=[8, 8])
    assert fitted.dispatch_rows == (8,)
    assert fitted.metadata.fit is not None and fitted.metadata.fit.max_abs_relative_error < 1e-3
    shape_only = fit_profile(samples)
    assert shape_only.metadata.fit is not None
    assert shape_only.metadata.fit.max_abs_relative_error > 0.05  # a convex fit cannot bend down
    path = tmp_path / "p.json"
    fitted.save(path)
    assert ProfiledCostModel.load(path).step_time(decode[9]) == pytest.approx(
        truth.step_time(decode[9])
    )
    with pytest.raises(HeddleError, match="bad kernel-switch term"):
        ProfiledCostModel({"tokens_upto_x": 1.0})


def test_fit_report_warns_when_the_fit_is_noisy():
    from heddle.sim.profiled import NOISY_FIT, FitReport

    quiet = FitReport(num_samples=166, median_abs_relative_error=0.042,
                      max_abs_relative_error=0.2, rms_seconds=1e-3)
    noisy = FitReport(num_samples=166, median_abs_relative_error=0.099,
                      max_abs_relative_error=0.35, rms_seconds=1e-3)
    assert not any(line.startswith("warning") for line in quiet.lines())
    warned = [line for line in noisy.lines() if line.startswith("warning")]
    assert len(warned) == 1 and f"{100 * NOISY_FIT:.0f}%" in warned[0]
    assert noisy.lines()[0].startswith("fit over 166 samples: median |error| 9.9%")
