"""Per-bucket error of a cost model against measured steps."""

from __future__ import annotations

import pytest

from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.step_error import bucket, step_errors


class _PerToken(CostModel):
    def step_time(self, shape: StepShape) -> float:
        return 0.001 * shape.num_tokens


def test_buckets_name_the_kind_of_step():
    assert bucket(StepShape((), (100,))) == "decode b=1 ctx<=256"
    assert bucket(StepShape((), (600,) * 8)) == "decode b=5-16 ctx<=1024"
    assert bucket(StepShape((), (2000,) * 40)) == "decode b=17+ ctx>1024"
    assert bucket(StepShape(((100, 100),), ())) == "prefill tok=65-128"
    assert bucket(StepShape(((300, 900),), (5, 5, 5))) == "mixed b=2-4 tok=257-512"


def test_errors_per_bucket_and_overall():
    decode, prefill = StepShape((), (10, 10)), StepShape(((64, 64),), ())
    # The model predicts 2 ms and 64 ms; measured 2.5 ms / 1.6 ms and 32 ms.
    samples = [(decode, 0.0025), (decode, 0.0016), (prefill, 0.032)]
    report = step_errors(_PerToken(), samples)
    by_name = {b.name: b for b in report.buckets}
    d = by_name["decode b=2-4 ctx<=256"]
    assert d.num_steps == 2
    assert d.median_signed == pytest.approx((-0.2 + 0.25) / 2)
    assert d.median_abs == pytest.approx(0.225)
    assert d.share_of_time == pytest.approx(0.0041 / 0.0361)
    p = by_name["prefill tok=17-64"]
    assert (p.num_steps, p.median_signed, p.p90_abs) == (1, pytest.approx(1.0), pytest.approx(1.0))
    assert report.overall.num_steps == 3 and report.overall.median_abs == pytest.approx(0.25)
    assert report.lines()[1].startswith("all")
    with pytest.raises(ValueError, match="no measured"):
        step_errors(_PerToken(), [])
