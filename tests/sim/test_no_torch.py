"""The simulator's cost models and executor run without torch."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "heddle.sim",
    "heddle.sim.cost_model",
    "heddle.sim.executor",
    "heddle.sim.profiled",
    "heddle.sim.profiles_check",
    "heddle.sim.profiling",
    "heddle.sim.registry",
    "heddle.sim.roofline",
    "heddle.sim.specs",
]


def test_sim_modules_do_not_import_torch():
    code = f"import sys; import {', '.join(MODULES)}; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
