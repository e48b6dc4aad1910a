"""benchmarks/sim_step_bytecodes.py: its counts are exact (the same on every run) and split
the step into its phases."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def test_counts_are_deterministic_and_grow_with_rows() -> None:
    from sim_step_bytecodes import count_bytecodes

    few = count_bytecodes(rows=2, steps=4)
    assert few == count_bytecodes(rows=2, steps=4)
    assert set(few) == {"schedule", "execute", "update", "other"}
    assert all(count > 0 for count in few.values())
    more = count_bytecodes(rows=8, steps=4)
    # Each decoding row is visited by the scheduler, the executor and update.
    for phase in ("schedule", "execute", "update"):
        assert more[phase] > few[phase]
