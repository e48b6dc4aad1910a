"""benchmarks/predictor_accuracy_real.py's replay, on hand-made timelines (no model)."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")


def _sequential(lengths: list[int], classes: list[str]):
    """One stream: request i arrives at 2i, has each checkpoint's tokens at 2i + 0.5 and
    finishes at 2i + 1, before the next arrives."""
    from predictor_accuracy_real import Record

    return [Record(arrival=2.0 * i, finish=2.0 * i + 1, output_len=n, request_class=cls,
                   reached={64: 2.0 * i + 0.5, 256: 2.0 * i + 0.5})
            for i, (n, cls) in enumerate(zip(lengths, classes, strict=True))]


def test_replay_pairs_only_running_kept_requests_and_ranks_classes_exactly():
    from predictor_accuracy_real import replay_accuracy

    n = 80  # short "a" (10 tokens) and long "b" (300) in turn; the first 20 are warm-up
    records = _sequential([10 if i % 2 == 0 else 300 for i in range(n)],
                          ["a" if i % 2 == 0 else "b" for i in range(n)])
    out = replay_accuracy(records, warmup=0.25)
    # At 0 every kept request; by then 10 of each class have finished: both rank exactly.
    assert out["0"]["requests"] == 60 and out["0"]["pairs"] == 60 * 59 // 2
    assert out["0"]["tau_repredict"] == pytest.approx(1.0)
    assert out["0"]["tau_arrival"] == pytest.approx(1.0)
    # At 64 and 256 only the long ones still run; their remaining lengths are all alike.
    for c in ("64", "256"):
        assert out[c]["requests"] == 30 and out[c]["pairs"] == 30 * 29 // 2
        assert math.isnan(out[c]["tau_repredict"])


def test_replay_learns_nothing_from_finishes_it_could_not_have_seen():
    from predictor_accuracy_real import replay_accuracy

    records = _sequential([10 if i % 2 == 0 else 300 for i in range(40)],
                          ["a" if i % 2 == 0 else "b" for i in range(40)])
    for r in records:  # all arrive (and pass each checkpoint) before anything finishes
        r.arrival, r.reached = 0.0, {64: 0.5, 256: 0.5}
    out = replay_accuracy(records, warmup=0.0)
    assert out["0"]["requests"] == 40
    # Every prediction is the default: constant, so no rank agreement at all.
    assert math.isnan(out["0"]["tau_repredict"]) and math.isnan(out["0"]["tau_arrival"])
