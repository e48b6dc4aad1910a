"""The remaining-length re-predictor (`RemainingLenPredictor`) and Kendall's tau-b."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from heddle.core.policies import make_policy
from heddle.core.policies.predictor import RemainingLenPredictor
from heddle.metrics.rank import kendall_tau_b
from heddle.reasoning import Phase, ReasoningState
from heddle.request import FinishReason
from tests.factories import create_request


def tau_by_pairs(x, y):
    """tau-b by definition, pair by pair."""
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx = (x[i] > x[j]) - (x[i] < x[j])
        sy = (y[i] > y[j]) - (y[i] < y[j])
        c += sx * sy > 0
        d += sx * sy < 0
        tx += sx != 0
        ty += sy != 0
    return (c - d) / math.sqrt(tx * ty)


def test_kendall_tau_b_matches_the_pairwise_definition_with_ties():
    rng = random.Random(3)
    for n in (2, 5, 40):
        x = [rng.randint(0, 6) for _ in range(n)]
        y = [rng.randint(0, 6) for _ in range(n)]
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        assert kendall_tau_b(x, y) == pytest.approx(tau_by_pairs(x, y))
    assert kendall_tau_b([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(kendall_tau_b([1, 1], [1, 2]))
    with pytest.raises(ValueError):
        kendall_tau_b([1], [1, 2])


def request_at(request_id, generated, *, cls="", thinking_len=None, max_tokens=100_000):
    """A simulated request that has generated `generated` tokens (its phase tracked)."""
    request = create_request(request_id, max_tokens=max_tokens, request_class=cls)
    if thinking_len is not None:
        request.reasoning = ReasoningState(
            phase=Phase.THINKING if thinking_len else Phase.ANSWERING,
            true_thinking_len=thinking_len or None,
        )
    for _ in range(generated):
        request.append_output_token(7)
        if request.reasoning is not None:
            request.reasoning.observe(7)
    return request


def finish(predictor, request_id, total, **kwargs):
    request = request_at(request_id, total, **kwargs)
    request.finish_reason = FinishReason.STOP
    predictor.observe(request)


def test_remaining_is_the_mean_residual_life_of_the_lengths_seen():
    predictor = RemainingLenPredictor(default_output_len=50, min_samples=4, use_max_tokens=False)
    assert predictor.predict_remaining(request_at("new", 0)) == 50  # nothing learnt yet
    assert predictor.predict_remaining(request_at("late", 60)) == 1  # past the default
    for i, length in enumerate([10, 10, 100, 100]):
        finish(predictor, f"r{i}", length)
    assert predictor.predict_remaining(request_at("a", 0)) == pytest.approx(55)
    # 20 tokens in, only the long ones are still possible: it has 80 to go, not 35.
    assert predictor.predict_remaining(request_at("b", 20)) == pytest.approx(80)
    # Beyond every length seen: a quarter of what it has used.
    assert predictor.predict_remaining(request_at("c", 400)) == pytest.approx(100)


def test_the_max_tokens_bound_caps_predictions_and_answers_for_an_unlearnt_class():
    predictor = RemainingLenPredictor(min_samples=4)
    unbounded = RemainingLenPredictor(min_samples=4, use_max_tokens=False)
    for p in (predictor, unbounded):
        for i, length in enumerate([10, 10, 100, 100]):
            finish(p, f"r{i}", length, cls="chat")
    # Inside the lengths seen: the residual life, unless the bound is nearer.
    chat = {"cls": "chat"}
    assert predictor.predict_remaining(request_at("a", 20, max_tokens=1000, **chat)) == 80
    assert predictor.predict_remaining(request_at("b", 20, max_tokens=50, **chat)) == 30
    assert unbounded.predict_remaining(request_at("b", 20, max_tokens=50, **chat)) == 80
    # Past every length of its own, learnt class: an anomaly, a quarter of what it used.
    assert predictor.predict_remaining(request_at("c", 400, max_tokens=1000, **chat)) == 100
    # A class not learnt yet (no story finished), past every length of all classes: most
    # likely a long class none of whose members has finished: it runs to its bound.
    story = request_at("s", 400, max_tokens=1000, cls="story")
    assert predictor.predict_remaining(story) == 600
    assert unbounded.predict_remaining(story) == 100
    assert predictor.num_outlived == 2 and predictor.num_to_bound == 1
    assert unbounded.num_outlived == 1 and unbounded.num_to_bound == 0
    # Inside the lengths seen, the unlearnt class takes all classes' residual life.
    assert predictor.predict_remaining(request_at("t", 20, max_tokens=1000, cls="story")) == 80
    # No bound at all (no max_tokens, no model length): a quarter of what it has used.
    free = request_at("d", 400, cls="story")
    free.sampling_params = free.sampling_params.__class__(max_tokens=None)
    free.max_output_tokens = 1 << 62
    assert predictor.predict_remaining(free) == pytest.approx(100)
    # Thinking past every thinking length seen, its class unlearnt: the bound holds the
    # answer too; inside them, thinking residual plus the answer, under the bound.
    for i in range(4):
        finish(predictor, f"t{i}", 130, cls="math", thinking_len=100)
    thinking = request_at("x", 150, cls="proof", thinking_len=1000, max_tokens=500)
    assert thinking.reasoning is not None and thinking.reasoning.is_thinking
    assert predictor.predict_remaining(thinking) == pytest.approx(350)
    early = request_at("y", 50, cls="math", thinking_len=1000, max_tokens=500)
    assert predictor.predict_remaining(early) == pytest.approx(50 + 30)
    tight = request_at("z", 50, cls="math", thinking_len=1000, max_tokens=60)
    assert predictor.predict_remaining(tight) == pytest.approx(10)


def test_thinking_requests_add_the_answer_and_classes_are_kept_apart():
    predictor = RemainingLenPredictor(min_samples=2)
    for i in range(3):
        finish(predictor, f"t{i}", 1000 + 30, cls="math", thinking_len=1000)  # 30-token answers
        finish(predictor, f"c{i}", 200, cls="chat", thinking_len=0)
    thinking = request_at("x", 100, cls="math", thinking_len=1000)
    assert thinking.reasoning is not None and thinking.reasoning.is_thinking
    assert predictor.predict_remaining(thinking) == pytest.approx(900 + 30)
    answering = request_at("y", 1010, cls="math", thinking_len=1000)
    assert not answering.reasoning.is_thinking
    assert predictor.predict_remaining(answering) == pytest.approx(20)
    assert predictor.predict_remaining(request_at("z", 50, cls="chat", thinking_len=0)) == 150


def test_accuracy_pairs_are_recorded_at_the_checkpoints_when_the_request_finishes():
    predictor = RemainingLenPredictor(default_output_len=100, checkpoints=(0, 64))
    request = request_at("a", 0)
    predictor.predict_remaining(request)
    for _ in range(70):
        request.append_output_token(7)
        predictor.predict_remaining(request)
    for _ in range(30):
        request.append_output_token(7)
    request.finish_reason = FinishReason.STOP
    predictor.observe(request)
    # At 0: predicted the default 100, 100 were to come; at 64: max(1, 100 - 64), 36 to come.
    assert predictor.accuracy == {0: [(100.0, 100, "a")], 64: [(36.0, 36, "a")]}
    aborted = request_at("b", 0)
    predictor.predict_remaining(aborted)
    aborted.finish_reason = FinishReason.ABORT
    predictor.observe(aborted)
    assert len(predictor.accuracy[0]) == 1  # an abort teaches and scores nothing


def test_sjf_with_repredict_reorders_as_requests_generate():
    policy = make_policy("sjf", repredict=True, min_samples=1)
    for i, length in enumerate([10] * 4 + [300] * 4):
        request = request_at(f"f{i}", length)
        request.finish_reason = FinishReason.STOP
        policy.on_finished(request)
    fresh, survivor = request_at("fresh", 0), request_at("survivor", 20)
    # At arrival `fresh` is expected to need 155 more; `survivor`, past every short one,
    # 280 more: so the fresh one goes first (a fixed prediction would rank them the other
    # way: 155 - 0 > 155 - 20).
    assert policy.predicted_output_len(fresh) == pytest.approx(155)
    assert policy.predicted_output_len(survivor) == pytest.approx(300)
    assert policy.sort_key(fresh, 0.0) < policy.sort_key(survivor, 0.0)
