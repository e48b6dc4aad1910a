"""Verification: greedy is exact; rejection sampling preserves the target distribution.

The statistical tests draw many verifications of fixed logits with fixed seeds and compare the
emitted tokens' frequencies with the target distribution by a chi-square test at p = 0.001
(so a correct sampler fails with probability 0.1% per seed; the seeds are fixed, the test is
deterministic). A wrong residual (sampling the rejection from p instead of max(0, p - q)) or a
wrong acceptance ratio shifts the frequencies far past the critical value: checked too.
"""

from __future__ import annotations

import pytest
import torch

from heddle.model.sampler import Sampler, SamplingRow
from heddle.request import SamplingParams
from heddle.spec.rejection import sampling_probs, verify

VOCAB = 6
# Critical values of chi-square at p = 0.001.
CHI2_CRIT = {5: 20.515, 4: 18.467, 3: 16.266, 2: 13.816, 1: 10.828}
N = 4000


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: threads only add contention (and minutes on a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    assert int(counts[~keep].sum()) == 0, "a token of zero probability was emitted"
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    return stat, int(keep.sum()) - 1


def test_greedy_accepts_the_argmax_prefix():
    logits = torch.tensor([[0.0, 5, 1], [3.0, 0, 1], [0.0, 1, 4]])
    greedy = SamplingParams(temperature=0.0)
    assert verify(logits, [1, 0], greedy) == [1, 0, 2]  # all accepted + bonus
    assert verify(logits, [1, 2], greedy) == [1, 0]  # second rejected: the argmax instead
    assert verify(logits, [2, 0], greedy) == [1]
    assert verify(logits[:1], [], greedy) == [1]


def run_verifications(p_logits: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first emitted token, and of the second given the first was the draft."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.zeros(VOCAB)
    second = torch.zeros(VOCAB)
    # Point masses (as prompt lookup proposes) on each row's second most likely token: often
    # rejected, often accepted.
    p = sampling_probs(p_logits, params)
    point = [int(p[i].argsort()[-2]) for i in range(2)]
    for _ in range(N):
        if q is None:
            drafts = point
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=generator)) for i in range(2)]
        out = verify(p_logits, drafts, params, q, generator)
        first[out[0]] += 1
        if out[0] == drafts[0] and len(out) > 1:
            second[out[1]] += 1
    return first, second


def target():
    torch.manual_seed(3)
    return torch.randn(3, VOCAB) * 1.5


def test_draft_model_sampling_preserves_the_target_distribution():
    params = SamplingParams(temperature=0.8)
    p_logits = target()
    q = torch.softmax(torch.randn(2, VOCAB), dim=-1)  # a draft that disagrees
    p = sampling_probs(p_logits, params)
    first, second = run_verifications(p_logits, q, params, seed=0)
    for counts, row in ((first, p[0]), (second, p[1])):
        stat, df = chi2(counts, row)
        assert stat < CHI2_CRIT[df], (stat, counts, row)


def test_point_mass_drafts_preserve_the_target_distribution_with_top_k_top_p():
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.9)
    p_logits = target()
    p = sampling_probs(p_logits, params)
    first, second = run_verifications(p_logits, None, params, seed=1)
    for counts, row in ((first, p[0]), (second, p[1])):
        stat, df = chi2(counts, row)
        assert stat < CHI2_CRIT[df], (stat, counts, row)


def test_a_wrong_residual_is_caught():
    """Sampling the rejected position from p (not max(0, p - q)) biases it; chi-square sees it."""
    params = SamplingParams(temperature=0.8)
    p_logits = target()
    q = torch.softmax(torch.randn(2, VOCAB) * 2, dim=-1)
    p = sampling_probs(p_logits, params)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(VOCAB)
    for _ in range(N):
        draft = int(torch.multinomial(q[0], 1, generator=generator))
        accept = min(1.0, float(p[0, draft] / q[0, draft]))
        if float(torch.rand((), generator=generator)) < accept:
            counts[draft] += 1
        else:
            counts[int(torch.multinomial(p[0], 1, generator=generator))] += 1
    stat, df = chi2(counts, p[0])
    assert stat > CHI2_CRIT[df]


def test_sampling_probs_is_the_samplers_distribution():
    """The distribution verification preserves is the one heddle's sampler draws from."""
    torch.manual_seed(5)
    logits = torch.randn(1, VOCAB) * 2
    sampler = Sampler(torch.device("cpu"))
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=3),
                   SamplingParams(temperature=1.0, top_p=0.8),
                   SamplingParams(temperature=1.3, top_k=4, top_p=0.7)):
        torch.manual_seed(11)
        rows = [SamplingRow("r", params, 0, None)] * 4000
        tokens, _ = sampler.sample(logits.repeat(4000, 1), rows)
        counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).float()
        stat, df = chi2(counts, sampling_probs(logits, params)[0])
        assert stat < CHI2_CRIT.get(df, 20.515), (params, stat)
