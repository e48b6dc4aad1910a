"""The simulator (cost models, executor, `heddle simulate`), the model shape, the profiler and
the shared CLI flags run without torch."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "heddle.sim",
    "heddle.sim.cost_model",
    "heddle.sim.executor",
    "heddle.sim.profiled",
    "heddle.sim.step_error",
    "heddle.sim.nnls",
    "heddle.sim.profiles_check",
    "heddle.sim.registry",
    "heddle.sim.roofline",
    "heddle.sim.specs",
    "heddle.sim.simulator",
    "heddle.sim.cli",
    "heddle.model_shape",
    "heddle.model.spec",
    "heddle.model.profiling",
    "heddle.model.step_log",
    "heddle.cli.profile",
    "heddle.cli.flags",
]


def test_sim_modules_do_not_import_torch():
    code = f"import sys; import {', '.join(MODULES)}; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
