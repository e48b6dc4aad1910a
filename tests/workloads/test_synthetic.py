from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from heddle.errors import HeddleError
from heddle.workloads import (
    WorkloadRequest,
    all_at_once,
    arrival_times,
    chat,
    gamma,
    get_workload,
    list_workloads,
    long_prompt_mix,
    multi_tenant,
    poisson,
    random_workload,
    reasoning_mix,
    synthetic_prompt_ids,
)


@pytest.mark.parametrize(
    "name",
    [
        "random",
        "chat",
        "long-prompt-mix",
        "reasoning-mix",
        "thinking-mix",
        "multi-tenant",
        "agent",
        "agent-swe",
        "agent-bfcl",
        "agent-fanout",
    ],
)
def test_same_seed_same_workload(name: str) -> None:
    a = get_workload(name, seed=3, num_requests=50, rate=2.0)
    b = get_workload(name, seed=3, num_requests=50, rate=2.0)
    c = get_workload(name, seed=4, num_requests=50, rate=2.0)
    assert a.requests == b.requests
    assert a.programs == b.programs
    assert a.requests != c.requests


def test_rate_changes_arrivals_not_lengths() -> None:
    slow = chat(seed=1, num_requests=100, rate=1.0)
    fast = chat(seed=1, num_requests=100, rate=10.0)
    assert [(r.prompt_len, r.output_len) for r in slow] == [
        (r.prompt_len, r.output_len) for r in fast
    ]
    assert slow[-1].arrival_time > fast[-1].arrival_time


def test_arrivals_sorted_and_start_at_zero() -> None:
    for name in ("random", "chat", "multi-tenant"):
        times = [r.arrival_time for r in get_workload(name, num_requests=100, rate=3.0)]
        assert times[0] == 0.0
        assert times == sorted(times)


def test_chat_means_close_to_target() -> None:
    requests = chat(seed=0, num_requests=20000)
    assert statistics.mean(r.prompt_len for r in requests) == pytest.approx(160, rel=0.05)
    assert statistics.mean(r.output_len for r in requests) == pytest.approx(340, rel=0.05)
    assert all(4 <= r.prompt_len <= 2048 and 4 <= r.output_len <= 2048 for r in requests)


def test_length_scale_multiplies_lengths() -> None:
    full = chat(seed=0, num_requests=5000)
    quarter = chat(seed=0, num_requests=5000, length_scale=0.25, min_len=1)
    ratio = statistics.mean(r.output_len for r in quarter) / statistics.mean(
        r.output_len for r in full
    )
    assert ratio == pytest.approx(0.25, rel=0.02)


def test_random_fixed_and_ranged_lengths() -> None:
    fixed = random_workload(num_requests=10, input_len=100, output_len=20)
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(100, 20)}
    ranged = random_workload(num_requests=500, input_len=100, output_len=20, range_ratio=0.5)
    assert min(r.prompt_len for r in ranged) >= 50
    assert max(r.prompt_len for r in ranged) <= 150
    assert len({r.prompt_len for r in ranged}) > 50


def test_long_prompt_mix_shares_and_lengths() -> None:
    requests = long_prompt_mix(seed=2, num_requests=1000, long_share=0.1)
    longs = [r for r in requests if r.request_class == "long"]
    shorts = [r for r in requests if r.request_class == "short"]
    assert len(longs) == 100 and len(shorts) == 900
    assert all(2000 <= r.prompt_len <= 4000 and r.output_len <= 128 for r in longs)
    assert statistics.mean(r.prompt_len for r in shorts) < 300


def test_reasoning_mix_shares_and_lengths() -> None:
    requests = reasoning_mix(seed=2, num_requests=1000, reasoning_share=0.2)
    deep = [r.output_len for r in requests if r.request_class == "reasoning"]
    short = [r.output_len for r in requests if r.request_class == "short"]
    assert len(deep) == 200 and len(short) == 800
    assert statistics.mean(deep) / statistics.mean(short) > 10


def test_thinking_mix_classes_phases_and_means() -> None:
    requests = get_workload("thinking-mix", seed=1, num_requests=2000).requests
    by_class: dict[str, list[WorkloadRequest]] = {}
    for r in requests:
        by_class.setdefault(r.request_class, []).append(r)
        assert 0 <= r.thinking_len < r.output_len <= 32768
    assert {c: len(v) for c, v in by_class.items()} == {"chat": 1200, "qa": 500, "math": 300}
    assert all(r.thinking_len == 0 for r in by_class["chat"])
    for cls, thinking in (("qa", 1100), ("math", 12000)):
        mean = statistics.mean(r.thinking_len for r in by_class[cls])
        assert 0.85 * thinking < mean < 1.15 * thinking
    with pytest.raises(HeddleError, match="sum to 1"):
        get_workload("thinking-mix", chat_share=0.5)


def test_multi_tenant_flood_share_and_users() -> None:
    requests = multi_tenant(seed=0, num_requests=1000, num_users=4, flood_share=0.7)
    by_user: dict[str | None, int] = {}
    for r in requests:
        by_user[r.user] = by_user.get(r.user, 0) + 1
        assert r.request_class == r.user
    assert by_user == {"flood": 700, "user-1": 100, "user-2": 100, "user-3": 100}


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_cv_and_rate(cv: float) -> None:
    times = gamma(rate=4.0, cv=cv, n=40000, rng=random.Random(7))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, rel=0.08)


def test_poisson_and_all_at_once() -> None:
    times = poisson(2.0, 20000, random.Random(0))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert all_at_once(3) == [0.0, 0.0, 0.0]
    assert poisson(math.inf, 3, random.Random(0)) == [0.0, 0.0, 0.0]
    with pytest.raises(HeddleError, match="unknown arrival process 'weibull'"):
        arrival_times("weibull", 1.0, 3, random.Random(0))
    with pytest.raises(HeddleError, match="positive"):
        poisson(0.0, 3, random.Random(0))


def test_gamma_workload_is_burstier() -> None:
    def cv_of(arrival: str, cv: float) -> float:
        times = [r.arrival_time for r in chat(num_requests=5000, rate=5.0, arrival=arrival, cv=cv)]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return statistics.stdev(gaps) / statistics.mean(gaps)

    assert cv_of("gamma", 4.0) > 2 * cv_of("poisson", 1.0)


def test_synthetic_prompt_ids() -> None:
    ids = synthetic_prompt_ids(1000, vocab_size=500, seed="x")
    assert len(ids) == 1000 and min(ids) >= 100 and max(ids) < 500
    assert ids == synthetic_prompt_ids(1000, vocab_size=500, seed="x")
    assert ids != synthetic_prompt_ids(1000, vocab_size=500, seed="y")
    assert set(synthetic_prompt_ids(200, vocab_size=50, seed=1, low=10, high=20)) <= set(
        range(10, 20)
    )
    with pytest.raises(HeddleError, match="smaller `low`"):
        synthetic_prompt_ids(10, vocab_size=50, seed=1)


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**70 + 3, -5, "x", "7:prompt"])
def test_synthetic_prompt_ids_are_random_randoms_draws(seed: int | str) -> None:
    """The ids (drawn with numpy) are exactly `random.Random(seed)`'s: the same prompts, and so
    the same prefix hits, as the workloads and golden runs recorded before."""
    import random

    for n, low, high in ((0, 100, 200), (1, 0, 2), (700, 100, 128256), (50, 5, 6)):
        draw = random.Random(seed).random
        expected = tuple(low + int(draw() * (high - low)) for _ in range(n))
        ids = synthetic_prompt_ids(n, vocab_size=high, seed=seed, low=low)
        assert ids == expected
        assert all(type(i) is int for i in ids)


def test_requests_have_distinct_prompts() -> None:
    a, b = random_workload(num_requests=2, input_len=64)
    assert a.prompt_ids(1000) != b.prompt_ids(1000)
    assert a.prompt_ids(1000) == random_workload(num_requests=2, input_len=64)[0].prompt_ids(1000)


def test_workload_request_validation() -> None:
    with pytest.raises(HeddleError, match="output_len"):
        WorkloadRequest("r", 0.0, 10, 0)
    with pytest.raises(HeddleError, match="does not match"):
        WorkloadRequest("r", 0.0, 3, 1, prompt_token_ids=(1, 2))
    r = WorkloadRequest("r", 0.0, 2, 1, prompt_token_ids=[5, 6])  # type: ignore[arg-type]
    assert r.prompt_token_ids == (5, 6)


def test_unknown_workload_lists_known_names() -> None:
    with pytest.raises(HeddleError) as err:
        get_workload("chatty")
    message = str(err.value)
    assert "unknown workload 'chatty'" in message
    for name in list_workloads():
        assert name in message


def test_unknown_parameter_lists_parameters() -> None:
    with pytest.raises(HeddleError, match=r"no parameter.*long_share.*its parameters:.*input_len"):
        get_workload("random", long_share=0.5)


def test_none_kwargs_mean_default_and_slos_apply() -> None:
    w = get_workload("chat", num_requests=5, rate=None, ttft_slo=0.5, tpot_slo=None)
    assert w.params["rate"] == math.inf
    assert all(r.ttft_slo == 0.5 and r.tpot_slo is None for r in w)
    described = w.describe()
    assert described["name"] == "chat" and described["seed"] == 0
    assert described["params"]["rate"] == "inf" and described["params"]["ttft_slo"] == 0.5
    assert described["num_requests"] == 5
