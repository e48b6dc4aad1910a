"""The roofline's linear-layer times against measured H100/A100 profiles (shared/gpu-profiles).

Bounds, for the shipped h100 and a100 specs at tp=1, over Llama-2-7B/70B and Llama-3-8B:
- median absolute relative error over all rows with >= 64 tokens: at most 15%
  (measured at calibration: h100 9%, a100 6%);
- every token-count bucket's median absolute relative error: at most 25%
  (the worst bucket is 65-256 tokens, the ridge between memory- and compute-bound, where
  max(compute, memory) is optimistic: h100 19%, a100 23%).
"""

from __future__ import annotations

import pytest

from heddle.sim.profiles_check import (
    calibrate,
    check_hardware,
    error_table,
    load_profiles,
    median_abs_error,
    profiles_dir,
)
from heddle.sim.specs import load_hardware_spec

MIN_TOKENS = 64
OVERALL_BOUND = 0.15
BUCKET_BOUND = 0.25

PROFILES = profiles_dir()
pytestmark = pytest.mark.skipif(
    PROFILES is None,
    reason="no gpu-profiles: put shared/ beside the repository or set HEDDLE_SHARED",
)


@pytest.mark.parametrize("hardware", ["h100", "a100"])
def test_roofline_error_is_within_the_stated_bounds(hardware):
    assert PROFILES is not None
    comparisons = check_hardware(hardware, PROFILES)
    assert len({c.measured.model.name for c in comparisons}) == 2
    assert median_abs_error(comparisons, min_tokens=MIN_TOKENS) <= OVERALL_BOUND
    for bucket, row in error_table(comparisons).items():
        assert row["all"] <= BUCKET_BOUND, (bucket, row)


@pytest.mark.parametrize("hardware", ["h100", "a100"])
def test_shipped_efficiencies_are_the_calibrated_ones(hardware):
    assert PROFILES is not None
    shipped = load_hardware_spec(hardware)
    calibrated = calibrate(shipped, load_profiles(PROFILES, hardware))
    assert calibrated.compute_efficiency == pytest.approx(shipped.compute_efficiency, abs=0.011)
    assert calibrated.memory_efficiency == pytest.approx(shipped.memory_efficiency, abs=0.011)
