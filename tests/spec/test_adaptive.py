"""The per-request draft-count decision: acceptance tracking, the step cost table, the greedy."""

from __future__ import annotations

import math

import pytest

from heddle.spec.adaptive import (
    EXACT_TOKENS,
    AcceptanceTracker,
    DraftCandidate,
    StepCostTable,
    choose_draft_counts,
    may_pay,
)


def test_acceptance_counts_positions_until_the_first_rejection():
    tracker = AcceptanceTracker(prior_rate=0.5, prior_weight=2.0, decay=1.0)
    assert tracker.rate("a") == 0.5
    tracker.observe("a", 4, 4)  # 4 successes, no failure
    tracker.observe("a", 4, 1)  # 1 success, 1 failure (positions 3 and 4 never tried)
    # own: 5 successes of 6 trials; prior (global, 0.5 shrunk by the slow decay) weighs 2.
    g = tracker.global_rate
    assert tracker.rate("a") == pytest.approx((5 + 2 * g) / (6 + 2))
    assert tracker.num_drafted == 8 and tracker.num_accepted == 5
    with pytest.raises(ValueError):
        tracker.observe("a", 2, 3)
    tracker.forget(["a"])
    assert tracker.rate("a") == g


def test_acceptance_follows_a_request_that_stops_matching():
    tracker = AcceptanceTracker(prior_weight=1.0, decay=0.8)
    for _ in range(20):
        tracker.observe("r", 4, 4)
    high = tracker.rate("r")
    for _ in range(10):
        tracker.observe("r", 4, 0)
    assert high > 0.9 and tracker.rate("r") < 0.45


def flat_then_linear(knee: int, base: float = 0.01, per_token: float = 0.001) -> StepCostTable:
    """Steps cost `base` up to `knee` tokens (memory-bound), then grow per token."""
    table = StepCostTable(decay=1.0)
    for tokens in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        table.observe(tokens, base + per_token * max(0, tokens - knee))
    return table


def test_cost_table_interpolates_and_extrapolates_pessimistically():
    table = StepCostTable(decay=1.0)
    assert not table.known and math.isnan(table.cost(4))
    table.observe(10, 1.0)
    table.observe(10, 1.2)  # one bucket per token count up to EXACT_TOKENS: mean 1.1 s
    table.observe(40, 2.0)
    table.observe(40, 0.5)  # a noisy fast step: the mean, 1.25, still >= the smaller bucket
    assert table.cost(10) == pytest.approx(1.1)
    assert table.cost(1) == pytest.approx(1.1)  # below what was seen: the smallest bucket
    assert table.cost(25) == pytest.approx(1.1 + 0.15 * 15 / 30)
    assert table.cost(80) == pytest.approx(1.25 * 2)  # beyond: in proportion to tokens
    assert table.has(10) and not table.has(11) and not table.has(80)
    # Above EXACT_TOKENS, four buckets per doubling.
    table.observe(EXACT_TOKENS * 2, 3.0)
    table.observe(EXACT_TOKENS * 2 + 10, 3.2)
    assert table.has(EXACT_TOKENS * 2 + 5) and not table.has(EXACT_TOKENS * 4)
    assert table.cost(EXACT_TOKENS * 2 + 5) == pytest.approx(3.1)


def test_cost_table_sees_a_step_of_a_few_tokens():
    """The staircase measured on the embedded model (docs/SPECULATION.md): 64 rows 76 ms,
    64 rows + 6 drafts 92 ms (a new tile of the bf16 matmuls). With four buckets per doubling
    the two shared one bucket, and drafts at 64 rows looked nearly free."""
    table = StepCostTable(decay=1.0)
    for _ in range(10):
        table.observe(64, 0.076)
    table.observe(70, 0.092)
    assert table.cost(64) == pytest.approx(0.076) and table.cost(70) == pytest.approx(0.092)
    assert table.cost(67) == pytest.approx(0.084)
    # 64 requests accepting 0.7 of their drafts: 6 drafts are worth 4.2 tokens (+6.6%) on a
    # step 21% dearer, and none of a larger number pays either.
    many = [DraftCandidate(f"r{i}", rate=0.7, max_drafts=4) for i in range(64)]
    assert choose_draft_counts(many, 64, 64.0, table, 6) == {}
    assert not may_pay(64, 64.0, 0.7, 6, table)


def test_may_pay_bounds_the_greedy_from_above():
    """may_pay says no only where choose_draft_counts would take nothing, for any proposals
    no better than the bound's best draft."""
    tables = [flat_then_linear(knee=k) for k in (1, 8, 64)]
    stair = StepCostTable(decay=1.0)
    for tokens, seconds in ((1, 1.0), (2, 1.8), (3, 1.85), (5, 1.9), (16, 2.0), (17, 3.5)):
        stair.observe(tokens, seconds)
    tables.append(stair)
    for table in tables:
        for base in (1, 4, 16, 64):
            for rate in (0.1, 0.5, 0.9):
                for budget in (1, 4, 64):
                    cands = [DraftCandidate(f"r{i}", rate, 4) for i in range(base)]
                    chosen = choose_draft_counts(cands, base, float(base), table, budget)
                    if not may_pay(base, float(base), rate, min(budget, 4 * base), table):
                        assert chosen == {}, (base, rate, budget)
    assert not may_pay(4, 4.0, 0.8, 16, StepCostTable())  # nothing seen: nothing pays
    assert may_pay(4, 4.0, 0.8, 16, flat_then_linear(knee=64))
    assert not may_pay(256, 256.0, 0.8, 1000, flat_then_linear(knee=1))


def test_memory_bound_step_speculates_fully_and_compute_bound_step_not_at_all():
    table = flat_then_linear(knee=64)
    candidates = [DraftCandidate(f"r{i}", rate=0.8, max_drafts=4) for i in range(4)]
    # 4 decodes, far below the knee: every draft is free, all are taken.
    assert choose_draft_counts(candidates, 4, 4.0, table, 1000) == {f"r{i}": 4 for i in range(4)}
    # 256 decodes, far above the knee: a token costs ~0.001 s on a ~0.2 s step, while a draft
    # is worth at most 0.8 of a token of the step's 256: nothing pays.
    many = [DraftCandidate(f"r{i}", rate=0.8, max_drafts=4) for i in range(256)]
    assert choose_draft_counts(many, 256, 256.0, table, 1000) == {}
    # The token budget caps the drafts; a proposal's own length caps each request.
    assert sum(choose_draft_counts(candidates, 4, 4.0, table, 5).values()) == 5
    short = [DraftCandidate("s", rate=0.9, max_drafts=2)]
    assert choose_draft_counts(short, 1, 1.0, table, 10) == {"s": 2}
    assert choose_draft_counts(short, 1, 1.0, StepCostTable(), 10) == {}  # no costs yet
    unseen = StepCostTable()
    unseen.observe(40, 1.0)  # only steps of 32..63 tokens seen: a 4-token step is not weighed
    assert choose_draft_counts(candidates, 4, 4.0, unseen, 1000) == {}


def test_the_likely_drafts_go_first_and_weights_favour_slo_requests():
    # Cost rises 10% per token from the start: only drafts worth > ~0.1 x tokens per token.
    table = StepCostTable(decay=1.0)
    for tokens in (1, 2, 4, 8, 16, 32):
        table.observe(tokens, 1.0 + 0.1 * tokens)
    candidates = [
        DraftCandidate("likely", rate=0.9, max_drafts=8),
        DraftCandidate("unlikely", rate=0.2, max_drafts=8),
    ]
    chosen = choose_draft_counts(candidates, 2, 2.0, table, 100)
    assert chosen.get("likely", 0) >= 3 and "unlikely" not in chosen
    weighted = [DraftCandidate("slo", rate=0.5, max_drafts=8, weight=2.0),
                DraftCandidate("plain", rate=0.5, max_drafts=8)]
    chosen = choose_draft_counts(weighted, 2, 3.0, table, 100)
    assert chosen.get("slo", 0) > chosen.get("plain", 0)
    # Expected value per second never falls below the step without drafts.
    for cands, base in ((candidates, 2.0), (weighted, 3.0)):
        chosen = choose_draft_counts(cands, 2, base, table, 100)
        value = base + sum(
            c.weight * sum(c.rate**j for j in range(1, chosen.get(c.request_id, 0) + 1))
            for c in cands
        )
        assert value / table.cost(2 + sum(chosen.values())) >= base / table.cost(2)


def test_a_dear_first_draft_does_not_hide_cheap_later_ones():
    """A cost that jumps at 2 tokens (a kernel switch) and is flat after it: one draft alone
    does not pay, four do, and the step takes four."""
    table = StepCostTable(decay=1.0)
    for tokens, seconds in ((1, 1.0), (2, 1.8), (3, 1.85), (5, 1.9)):
        table.observe(tokens, seconds)
    candidate = [DraftCandidate("r", rate=0.8, max_drafts=4)]
    assert choose_draft_counts(candidate, 1, 1.0, table, 10) == {"r": 4}
    assert choose_draft_counts(candidate, 1, 1.0, table, 1) == {}  # one alone: 1.8 / 1.8 s


def test_drafts_must_beat_the_step_without_them_by_the_margin():
    table = StepCostTable(decay=1.0)
    for tokens, seconds in ((1, 1.0), (2, 1.2)):
        table.observe(tokens, seconds)
    # One draft worth 0.25 of a token on a step 20% dearer: 1.25 / 1.2 = +4% < 5%.
    candidate = [DraftCandidate("r", rate=0.25, max_drafts=1)]
    assert choose_draft_counts(candidate, 1, 1.0, table, 10, min_gain=0.05) == {}
    assert choose_draft_counts(candidate, 1, 1.0, table, 10, min_gain=0.0) == {"r": 1}
