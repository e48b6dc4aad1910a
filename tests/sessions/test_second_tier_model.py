"""The second KV tier on the real model: the executor's copies (torch tensors from the paged KV
cache into a bounded buffer and back), and an offloaded-then-restored session's greedy output
against a kept one's."""

from __future__ import annotations

import pytest
import torch

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from heddle.sessions.retention import Costs, ParkedView, Pressure, Retention, RetentionPolicy
from tests.server.live import CACHE, MAX_MODEL_LEN, shared_executor


class AlwaysOffload(RetentionPolicy):
    name = "always-offload"

    def on_park(self, view: ParkedView, pressure: Pressure, costs: Costs) -> Retention:
        return Retention.OFFLOAD


@pytest.fixture
def executor():
    executor = shared_executor()
    executor.attach_tier(32)
    yield executor
    executor.attach_tier(0)


def test_the_executor_copies_blocks_out_and_back_exactly(executor):
    caches = executor.kv_caches
    generator = torch.Generator().manual_seed(0)
    for cache in caches:
        cache[:, :, 10:13] = torch.randn(cache[:, :, 10:13].shape, generator=generator)
    expected = [cache[:, :, 10:13].clone() for cache in caches]
    executor.tier.copy(caches, [(10, 5), (11, 6), (12, 7)], [])
    for cache in caches:
        cache[:, :, 10:13] = 0
    executor.tier.copy(caches, [], [(5, 40), (6, 41), (7, 42)])  # into other blocks
    for cache, want in zip(caches, expected, strict=True):
        assert torch.equal(cache[:, :, 40:43], want)
        cache[:, :, 40:43] = 0
    assert executor.tier.bytes_copied == 6 * executor.tier.block_bytes
    assert executor.tier_copy_seconds(10) > 0
    with pytest.raises(ValueError, match="slot outside"):
        executor.tier.copy(caches, [(1, 32)], [])


def _engine(executor, retention: str, num_blocks: int, offload: bool) -> Engine:
    cache = CacheConfig(CACHE.block_size, num_blocks, offload_blocks=32 if offload else 0)
    config = EngineConfig(cache=cache, scheduler=SchedulerConfig(retention=retention))
    engine = Engine(
        config,
        executor,
        num_blocks=num_blocks,
        tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=executor.model_shape.vocab_size,
    )
    if offload:
        engine.scheduler.sessions.retention = AlwaysOffload()
    return engine


def _finish(engine: Engine) -> list[int]:
    for _ in range(500):
        for output in engine.step():
            if output.finished:
                return list(output.outputs[0].token_ids)
    raise AssertionError("did not finish")


def _two_turns_with_churn(engine: Engine, tag: str) -> tuple[list[int], list[int], int]:
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = tokenizer.encode("The agent reads the file and finds the bug in line", False) * 3
    engine.add_request(f"{tag}-0", prompt, params, session_id=tag)
    first = _finish(engine)
    # Another request that takes the whole pool (of the small engine): what it left cached of
    # the context is evicted.
    churn = tokenizer.encode("Unrelated text about the weather in spring. ", False) * 14
    engine.add_request(f"{tag}-churn", churn[:120], SamplingParams(temperature=0.0, max_tokens=1))
    _finish(engine)
    result = tokenizer.encode(" -> the test passes now. Next step:", False)
    engine.add_request(f"{tag}-1", prompt + first + result, params, session_id=tag)
    request = engine.scheduler.requests[f"{tag}-1"]
    second = _finish(engine)
    engine.check_integrity()
    return first, second, request.num_cached_tokens


@pytest.mark.slow
def test_an_offloaded_then_restored_session_gives_the_kept_sessions_greedy_output(executor):
    kept = _engine(executor, "ttl", num_blocks=32, offload=False)  # room for the churn too
    first_kept, second_kept, cached_kept = _two_turns_with_churn(kept, "kept")
    assert cached_kept >= 32
    kept.scheduler.sessions.release_all()
    assert kept.kv_cache.num_used_blocks == 0

    moved = _engine(executor, "cost", num_blocks=8, offload=True)
    first, second, cached = _two_turns_with_churn(moved, "moved")
    tier = moved.scheduler.sessions.tier
    assert tier is not None
    assert tier.stats.num_restored == 1 and tier.stats.blocks_restored >= 2
    assert tier.stats.blocks_found_in_pool == 0  # the churn evicted them: all came by copy
    assert cached == cached_kept  # the restored turn computed only its new tokens
    assert (first, second) == (first_kept, second_kept)
    moved.scheduler.sessions.release_all()
    moved.check_integrity()
    assert moved.kv_cache.num_used_blocks == 0 and tier.num_used_slots == 0
