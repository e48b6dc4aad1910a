"""benchmarks/fidelity_terms.py and sim_fidelity.py's wait split, on hand-made step logs."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from heddle.model.profiling import profile_grid, profile_shapes
from heddle.model.step_log import save_steps
from heddle.sim.cost_model import StepShape
from heddle.sim.profiled import ProfiledCostModel, fit_profile

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")

# A machine whose steps with a prompt chunk cost 3 ms more (the eager layers), whatever their
# number of chunks: only a model with the layer-path term prices both kinds of step.
TRUE = ProfiledCostModel({"constant": 9e-3, "prefill_tokens": 2e-4, "decode_tokens": 3e-4,
                          "prefill_chunks": 1e-3, "prefill_step": 3e-3})  # fmt: skip


def test_fit_without_a_term_holds_it_at_zero_and_misses_what_it_prices():
    shapes = profile_grid(256, 32, 1024) + profile_shapes(256, 32, 1024, num_shapes=64)
    samples = [(s, TRUE.step_time(s)) for s in shapes]
    full = fit_profile(samples)
    assert full.coefficients["prefill_step"] == pytest.approx(3e-3, rel=0.02)
    reduced = fit_profile(samples, without=("prefill_step", "prefill_step_decode_tokens"))
    assert reduced.coefficients["prefill_step"] == 0.0
    assert reduced.metadata.fit.median_abs_relative_error > 10 * max(
        full.metadata.fit.median_abs_relative_error, 1e-4)
    with pytest.raises(Exception, match="unknown terms"):
        fit_profile(samples, without=("no_such_term",))


def test_fidelity_terms_prints_each_variant(tmp_path, capsys, monkeypatch):
    import fidelity_terms

    grid = profile_grid(256, 32, 1024)
    shapes = grid + profile_shapes(256, 32, 1024, num_shapes=64)
    base = tmp_path / "run.json"
    save_steps(base.with_suffix(".profile_steps.json"), [(s, TRUE.step_time(s)) for s in shapes],
               {"num_grid": len(grid), "dispatch_rows": [], "seed": 0})  # fmt: skip
    real = [StepShape(((40, 40),), (100,) * 3, num_sampled=4), StepShape((), (100,))] * 20
    save_steps(base.with_suffix(".steps.json"), [(s, TRUE.step_time(s)) for s in real])
    monkeypatch.setattr(sys, "argv", ["fidelity_terms.py", str(base)])
    fidelity_terms.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4
    by_name = {row.split(" | ")[0][2:]: row for row in rows[1:]}
    # With the layer-path term the fit is exact on the real steps; without it, it is not.
    assert "| 0.0% / 0.0% |" in by_name["both (this profile)"]
    assert "| 0.0% / 0.0% |" not in by_name["third pass: neither"]


def test_wait_parts_splits_the_wait_at_the_step_in_flight():
    import sim_fidelity

    class Log:
        def column(self, name):
            return {"start_time": [0.0, 1.0], "duration": [0.5, 0.5]}[name]

    records = [
        SimpleNamespace(arrival_time=0.2, first_scheduled_time=0.6),  # in step 0: 0.3 + 0.1
        SimpleNamespace(arrival_time=0.8, first_scheduled_time=0.82),  # idle: wake 0.02
        SimpleNamespace(arrival_time=1.0, first_scheduled_time=1.0),  # at a step's start: idle
    ]
    parts = sim_fidelity.wait_parts(records, Log())
    assert parts["in flight share"] == pytest.approx(1 / 3)
    assert parts["step left ms"] == pytest.approx(300.0)
    assert parts["after step ms"] == pytest.approx(100.0)
    assert parts["idle wake ms"] == pytest.approx(10.0)
    assert parts["wait ms"] == pytest.approx((400 + 20 + 0) / 3)


def test_targets_counts_the_figures_within_ten_percent(tmp_path, capsys):
    import json

    import sim_fidelity

    errors = dict.fromkeys(sim_fidelity.TARGET_FIGURES, 0.05) | {"ttft p50": -0.12}
    saved = {"dtype": "bf16", "num_requests": 30, "step_error_all": [100, 0.03, 0.08],
             "cases": [{"workload": "chat", "rate": 1.0, "runs": [{}, {}, {}],
                        "median_rel_error": errors,
                        "step_error": {"all": [100, 0.03, 0.08, 0.0]}}]}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(saved))
    sim_fidelity.targets([str(path)])
    out = capsys.readouterr().out
    assert "chat @ 1.0 (30 requests x 3): 6/7 within 10%; misses: ttft p50 -12.0%" in out
    assert "100 steps, median 3.0%, p90 8.0%" in out and "within 10%: 6 of 7" in out
