"""What `heddle profile` measures for the simulator's per-constrained-row term: the engine's own
mask fill, apply and advance over matchers that walk valid documents (timing is not checked:
only that each part ran and the sum is what the term takes)."""

from __future__ import annotations

import pytest

from heddle.errors import HeddleError
from heddle.structured.cost import measure_row_cost


def test_row_cost_times_fill_apply_and_accept(smol_tokenizer):
    cost = measure_row_cost(smol_tokenizer, smol_tokenizer.vocab_size, rows=3, repeats=6,
                            warmup=1)
    assert cost.rows == 3 and cost.repeats == 6
    assert min(cost.fill_s, cost.apply_s, cost.accept_s) > 0
    assert cost.per_row_s == pytest.approx((cost.fill_s + cost.apply_s + cost.accept_s) / 3)
    assert cost.as_dict()["per_row_s"] == cost.per_row_s
    with pytest.raises(HeddleError, match="rows"):
        measure_row_cost(smol_tokenizer, smol_tokenizer.vocab_size, rows=0)


def test_matchers_that_finish_start_over(smol_tokenizer):
    # A one-value schema ends within a few tokens: the walk restarts it and keeps timing.
    cost = measure_row_cost(smol_tokenizer, smol_tokenizer.vocab_size, rows=2, repeats=12,
                            warmup=0, schema={"type": "boolean"})
    assert cost.per_row_s > 0
