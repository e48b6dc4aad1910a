"""The sampler on hand-made logits: greedy, seeds, top-k/top-p, min_tokens, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from heddle.model.sampler import Sampler, SamplingRow
from heddle.request import SamplingParams

VOCAB = 50


def make_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, VOCAB, generator=generator) * 3


def rows(params: SamplingParams, count: int, prefix: str = "r", num_output: int = 0,
         eos: int | None = None) -> list[SamplingRow]:
    return [SamplingRow(f"{prefix}{i}", params, num_output, eos) for i in range(count)]


def sample(params: SamplingParams, logits: torch.Tensor, sampler: Sampler | None = None,
           **kwargs) -> list[int]:
    sampler = sampler or Sampler(torch.device("cpu"))
    tokens, _ = sampler.sample(logits.clone(), rows(params, logits.shape[0], **kwargs))
    return tokens


def test_greedy_is_argmax() -> None:
    logits = make_logits(8)
    assert sample(SamplingParams(temperature=0.0), logits) == logits.argmax(-1).tolist()


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = make_logits(16, seed=1)
    greedy = logits.argmax(-1).tolist()
    assert sample(SamplingParams(temperature=1.0, top_k=1), logits) == greedy
    assert sample(SamplingParams(temperature=1.5, top_p=1e-6), logits) == greedy
    assert sample(SamplingParams(temperature=0.8, top_k=5, top_p=1e-6), logits) == greedy


def test_seeded_sampling_is_reproducible_and_advances() -> None:
    logits = torch.zeros(4, VOCAB)  # uniform: every draw is up to the generator
    params = SamplingParams(temperature=1.0, seed=1234)
    first, second = Sampler(torch.device("cpu")), Sampler(torch.device("cpu"))
    runs_a = [sample(params, logits, first) for _ in range(5)]
    runs_b = [sample(params, logits, second) for _ in range(5)]
    assert runs_a == runs_b
    assert len({tuple(r) for r in runs_a}) > 1, "the generator must advance between steps"
    other = [sample(SamplingParams(temperature=1.0, seed=99), logits) for _ in range(1)]
    assert other[0] != runs_a[0]


def test_finished_requests_drop_their_generators() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(2, VOCAB)
    params = SamplingParams(temperature=1.0, seed=7)
    first = sample(params, logits, sampler)
    assert sampler.num_generators == 2
    sampler.forget(["r0", "r1"])
    assert sampler.num_generators == 0
    assert sample(params, logits, sampler) == first  # a new request with that seed starts over


def test_seeded_row_is_independent_of_its_batch() -> None:
    logits = torch.zeros(3, VOCAB)
    params = SamplingParams(temperature=1.0, seed=5)
    alone = Sampler(torch.device("cpu")).sample(logits[:1].clone(), rows(params, 1))[0]
    mixed_rows = [SamplingRow("x", SamplingParams(temperature=1.0), 0, None),
                  SamplingRow("r0", params, 0, None),
                  SamplingRow("y", SamplingParams(temperature=0.0), 0, None)]
    mixed = Sampler(torch.device("cpu")).sample(logits.clone(), mixed_rows)[0]
    assert mixed[1] == alone[0]


def test_sampling_follows_the_softmax_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(20000, 1)
    counts = torch.bincount(torch.tensor(sample(SamplingParams(temperature=1.0), logits)),
                            minlength=4).float() / 20000
    assert torch.allclose(counts, probs, atol=0.015)
    # temperature 2 flattens: p ~ sqrt(probs)
    hot = torch.bincount(torch.tensor(sample(SamplingParams(temperature=2.0), logits)),
                         minlength=4).float() / 20000
    flat = probs.sqrt() / probs.sqrt().sum()
    assert torch.allclose(hot, flat, atol=0.015)


def test_top_k_and_top_p_restrict_the_support() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    top_k = set(sample(SamplingParams(temperature=1.0, top_k=2), logits))
    assert top_k == {0, 1}
    # top_p=0.6: token 0 (0.5) is not enough, token 1 brings 0.8 >= 0.6; token 2 is cut.
    top_p = set(sample(SamplingParams(temperature=1.0, top_p=0.6), logits))
    assert top_p == {0, 1}
    top_p = set(sample(SamplingParams(temperature=1.0, top_p=0.85), logits))
    assert top_p == {0, 1, 2}


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, 3] = 10.0  # EOS is by far the most likely
    logits[:, 4] = 9.0  # then a stop token id
    logits[:, 5] = 8.0
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(4,))
    assert sample(params, logits, num_output=0, eos=3) == [5, 5]
    assert sample(params, logits, num_output=1, eos=3) == [5, 5]
    assert sample(params, logits, num_output=2, eos=3) == [3, 3]


def test_logprobs_are_raw_log_softmax_sorted() -> None:
    logits = make_logits(3, seed=2)
    raw = torch.log_softmax(logits, dim=-1)
    batch = [
        SamplingRow("g", SamplingParams(temperature=0.0, logprobs=5), 0, None),
        SamplingRow("t", SamplingParams(temperature=0.7, top_k=3, logprobs=2, seed=1), 0, None),
        SamplingRow("n", SamplingParams(temperature=0.0), 0, None),
    ]
    tokens, logprobs = Sampler(torch.device("cpu")).sample(logits.clone(), batch)
    assert set(logprobs) == {0, 1}
    greedy = logprobs[0]
    assert greedy.token_id == tokens[0] == raw[0].argmax().item()
    assert len(greedy.top) == 5
    assert greedy.top[0] == (greedy.token_id, pytest.approx(greedy.logprob))
    values = [lp for _, lp in greedy.top]
    assert values == sorted(values, reverse=True)
    for token_id, lp in greedy.top:
        assert lp == pytest.approx(raw[0, token_id].item(), abs=1e-5)
    assert math.fsum(math.exp(v) for v in raw[0].tolist()) == pytest.approx(1.0)
    sampled = logprobs[1]
    assert len(sampled.top) == 2
    # The sampled token's logprob is from the raw logits, not the temperature-scaled ones.
    assert sampled.logprob == pytest.approx(raw[1, tokens[1]].item(), abs=1e-5)


def test_zero_logprobs_returns_only_the_chosen_token() -> None:
    logits = make_logits(1)
    _, logprobs = Sampler(torch.device("cpu")).sample(
        logits.clone(), rows(SamplingParams(temperature=0.0, logprobs=0), 1)
    )
    assert logprobs[0].top == []
    assert logprobs[0].logprob <= 0.0


def test_mixed_batch_greedy_rows_unaffected_by_random_rows() -> None:
    logits = make_logits(6, seed=3)
    batch = [SamplingRow(f"m{i}", SamplingParams(temperature=0.0 if i % 2 else 1.0, top_p=0.9),
                         0, None) for i in range(6)]
    tokens, _ = Sampler(torch.device("cpu")).sample(logits.clone(), batch)
    for i in (1, 3, 5):
        assert tokens[i] == logits[i].argmax().item()
    assert all(0 <= t < VOCAB for t in tokens)


def test_top_p_after_top_k_uses_the_renormalized_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    # Alone, top_p=0.83 keeps three tokens (0.5 + 0.3 < 0.83). After top_k=3 renormalizes to
    # (0.526, 0.316, 0.158), the first two already reach 0.83.
    assert set(sample(SamplingParams(temperature=1.0, top_p=0.83), logits)) == {0, 1, 2}
    both = SamplingParams(temperature=1.0, top_k=3, top_p=0.83)
    assert set(sample(both, logits)) == {0, 1}


def test_top_p_on_a_flat_distribution_falls_back_to_the_whole_vocabulary() -> None:
    # 3000 equally likely tokens: the best 64, then 1024, hold too little mass for top_p=0.5,
    # so the sampler must sort the whole vocabulary and keep exactly 1500 tokens.
    logits = torch.zeros(4000, 3000)
    tokens = sample(SamplingParams(temperature=1.0, top_p=0.5), logits)
    assert 1100 < len(set(tokens)) <= 1500
