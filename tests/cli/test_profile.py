"""`heddle profile --from-run` and `heddle simulate --cost-model`'s coverage warning (no torch:
the fit reads a step log, the simulator a profile)."""

from __future__ import annotations

import pytest

from heddle.cli.main import main
from heddle.model.profiling import profile_grid, profile_shapes
from heddle.model.step_log import save_steps
from heddle.sim.profiled import ProfiledCostModel

TRUE = {"constant": 4e-3, "prefill_tokens": 60e-6, "decode_tokens": 90e-6,
        "decode_context_tokens": 20e-9, "prefill_chunks": 1e-3}  # fmt: skip


def test_profile_from_run_fits_and_checks_itself(tmp_path, capsys):
    truth = ProfiledCostModel(TRUE)
    shapes = profile_grid(64, 8, 512) + profile_shapes(64, 8, 512, num_shapes=60)
    run, out = tmp_path / "run.json", tmp_path / "profile.json"
    save_steps(run, [(s, truth.step_time(s)) for s in shapes], {"dtype": "bfloat16"})
    assert main(["profile", "--from-run", str(run), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"fitting to {len(shapes)} steps" in printed and "held out" in printed
    fitted = ProfiledCostModel.load(out)
    assert fitted.metadata.dtype == "bfloat16"
    assert fitted.metadata.fit is not None and fitted.metadata.fit.held_out_median_abs < 0.01
    assert main(["profile", "--from-run", str(tmp_path / "none.json")]) == 2
    assert "cannot read step log" in capsys.readouterr().err


def test_simulate_warns_when_steps_leave_the_profile(tmp_path, capsys):
    truth = ProfiledCostModel(TRUE)
    run, out = tmp_path / "run.json", tmp_path / "profile.json"
    shapes = profile_grid(64, 4, 256) + profile_shapes(64, 4, 256, num_shapes=60)
    save_steps(run, [(s, truth.step_time(s)) for s in shapes])
    assert main(["profile", "--from-run", str(run), "--output", str(out), "--held-out", "0"]) == 0
    args = ["simulate", "--cost-model", str(out), "--num-blocks", "512", "--num-requests", "20",
            "--rate", "50", "--workload-option", "length_scale=0.1", "--no-progress"]  # fmt: skip
    capsys.readouterr()
    # Profiled at 64 tokens and 4 seats, simulated at 256 and 16: outside.
    assert main([*args, "--max-num-batched-tokens", "256", "--max-num-seqs", "16"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "fell outside the shapes the profile measured" in err
    assert main([*args, "--max-num-batched-tokens", "64", "--max-num-seqs", "4",
                 "--max-model-len", "256"]) == 0  # fmt: skip
    assert "warning" not in capsys.readouterr().err


def test_profile_from_run_fits_the_idle_warmup_to_the_steps_after_a_gap(tmp_path, capsys):
    truth = ProfiledCostModel(TRUE)
    shapes = profile_grid(64, 8, 512) + profile_shapes(64, 8, 512, num_shapes=60)
    # Every third step follows 100 ms of idle and pays 6 ms more; the rest run back to back.
    gaps = [0.1 if i % 3 == 0 else 0.0002 for i in range(len(shapes))]
    times = [truth.step_time(s) + (0.006 if g > 0.01 else 0.0)
             for s, g in zip(shapes, gaps, strict=True)]  # fmt: skip
    run, out = tmp_path / "run.json", tmp_path / "profile.json"
    save_steps(run, list(zip(shapes, times, strict=True)), {}, gaps=gaps)
    assert main(["profile", "--from-run", str(run), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "idle warm-up" in printed and "with the warm-up" in printed
    fitted = ProfiledCostModel.load(out)
    assert fitted.warmup is not None and fitted.idle_time(0.1) == pytest.approx(0.006, rel=0.05)
    assert fitted.idle_time(0.0002) == 0.0
    check = fitted.metadata.extra["idle"]
    assert check["held_out_median_abs_with"] < 0.02 < check["held_out_median_abs_without"]
    # The shape prices come from the back-to-back steps: the warm-up did not leak into them.
    price = fitted.executor_only()
    assert price.step_time(shapes[1]) == pytest.approx(truth.step_time(shapes[1]), rel=0.02)
    # The engine's time around a step: the 0.2 ms gaps between back-to-back steps, whatever
    # their rows; the simulator charges it on top of the step's price. A log has no wake.
    assert fitted.host_constant == pytest.approx(0.0002, rel=1e-6) and fitted.wake == 0.0
    assert fitted.host_per_row == pytest.approx(0.0, abs=1e-9)
    assert fitted.step_time(shapes[1]) == pytest.approx(price.step_time(shapes[1]) + 0.0002)
    assert "engine time around a step: 0.200 ms" in printed
    assert main(["profile", "--from-run", str(run), "--idle-gaps", "0.1,x"]) == 2
    assert "--idle-gaps" in capsys.readouterr().err
