"""A seeded request resumed after k tokens draws what the uninterrupted one would have."""

from __future__ import annotations

import torch

from heddle.model.sampler import Sampler, SamplingRow
from heddle.request import SamplingParams


def test_seed_offset_continues_the_random_stream() -> None:
    torch.manual_seed(0)
    logits = [torch.randn(1, 50) for _ in range(12)]
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=12)
    whole = Sampler(torch.device("cpu"))
    uninterrupted = [
        whole.sample(logits[i].clone(), [SamplingRow("a", params, i, None)])[0][0]
        for i in range(12)
    ]
    resumed_sampler = Sampler(torch.device("cpu"))
    resumed_params = SamplingParams(temperature=1.0, seed=1234, seed_offset=7, max_tokens=5)
    resumed = [
        resumed_sampler.sample(
            logits[7 + i].clone(), [SamplingRow("a@1", resumed_params, i, None)]
        )[0][0]
        for i in range(5)
    ]
    assert resumed == uninterrupted[7:]
    fresh = Sampler(torch.device("cpu"))
    restarted = [
        fresh.sample(logits[7 + i].clone(), [SamplingRow("b", params, i, None)])[0][0]
        for i in range(5)
    ]
    assert restarted != uninterrupted[7:]  # without the offset the stream would restart
