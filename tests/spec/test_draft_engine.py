"""Draft-model speculation through the real engine: a tiny random Qwen3 target and a draft that
shares its vocabulary (the target's weights with noise, so it agrees often but not always),
both written by transformers to temp dirs and loaded by `Engine.from_config` with
`speculation=method=draft,model=PATH`. Greedy outputs are token for token those without
speculation (with preemption and chunked prefill in the same batch); the draft model's own KV
is dropped at finish and preemption; sampled requests run with the draft's distributions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heddle.cli.flags import parse_key_values
from heddle.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from heddle.engine.engine import Engine
from heddle.errors import HeddleError
from heddle.request import SamplingParams
from tests.model.test_tiny_models import VOCAB, qwen3

PROMPTS = [
    [5, 17, 300, 42, 8, 99, 250],
    [11, 12, 13],
    [7, 7, 400, 123, 9, 88, 61, 2, 33, 140, 77, 5, 19, 200, 301, 44, 3],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
]
NEW_TOKENS = 16
NUM_BLOCKS = 16  # 4-token blocks: too few for all four requests at full length


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    torch.manual_seed(11)
    target = qwen3().eval()
    target_path = tmp_path_factory.mktemp("target")
    target.save_pretrained(target_path)
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for param in target.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1 * param.std())
    draft_path = tmp_path_factory.mktemp("draft")
    target.save_pretrained(draft_path)
    return target_path, draft_path


def make_engine(target: Path, speculation: SpeculativeConfig) -> Engine:
    config = EngineConfig(
        model=ModelConfig(model=str(target), dtype="float32", quantization="none"),
        cache=CacheConfig(block_size=4, num_blocks=NUM_BLOCKS),
        scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4,
                                  speculation=speculation),
    )
    return Engine.from_config(config)


def run(engine: Engine, params: SamplingParams) -> dict[str, list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    outputs: dict[str, list[int]] = {}
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    assert len(outputs) == len(PROMPTS)
    return outputs


@pytest.mark.slow
def test_greedy_outputs_are_identical_with_a_draft_model(models):
    target, draft = models
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    reference = run(make_engine(target, SpeculativeConfig()), greedy)
    for adaptive in (False, True):
        engine = make_engine(target, SpeculativeConfig(method="draft", model=str(draft),
                                                       num_draft_tokens=3, adaptive=adaptive))
        proposer = engine.executor.draft  # type: ignore[attr-defined]
        assert proposer is not None
        assert run(engine, greedy) == reference
        spec = engine.scheduler.speculator
        assert spec is not None
        if not adaptive:  # (adaptive drafts where measured step times say it pays)
            # The noisy draft agrees often, not always: accepted runs and rejections.
            assert 0 < spec.acceptance.num_accepted < spec.acceptance.num_drafted
            assert engine.scheduler.num_preemptions > 0
        engine.check_integrity()
        assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
        # The draft model's KV goes with the requests: the executor hears of finishes with the
        # next step (as of the target's own state), so after one more request only its is kept.
        engine.add_request("last", [3, 1, 4, 1, 5], greedy)
        while engine.has_unfinished_requests():
            engine.step()
        assert proposer.request_ids in ([], ["last"])
        assert proposer.num_free_blocks >= proposer.executor.num_blocks - 7


@pytest.mark.slow
def test_sampled_requests_speculate_with_the_drafts_distribution(models):
    target, draft = models
    engine = make_engine(target, SpeculativeConfig(method="draft", model=str(draft),
                                                   num_draft_tokens=3, adaptive=False))
    sampled = SamplingParams(temperature=0.8, top_k=40, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = run(engine, sampled)
    assert all(len(tokens) == NEW_TOKENS for tokens in outputs.values())
    assert all(0 <= t < VOCAB for tokens in outputs.values() for t in tokens)
    spec = engine.scheduler.speculator
    assert spec is not None and spec.acceptance.num_accepted > 0
    engine.check_integrity()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_draft_options_from_the_command_line(tmp_path):
    items = parse_key_values(["method=draft", f"model={tmp_path}", "num_draft_tokens=2"])
    config = SpeculativeConfig(**items)
    assert config.model == str(tmp_path) and config.num_draft_tokens == 2
    with pytest.raises(HeddleError, match="needs model=PATH"):
        SpeculativeConfig(method="draft")
    with pytest.raises(HeddleError, match="only used with method=draft"):
        SpeculativeConfig(method="ngram", model=str(tmp_path))


def test_a_draft_model_must_share_the_vocabulary(models, tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.model.test_tiny_models import COMMON

    other = Qwen3ForCausalLM(Qwen3Config(**{**COMMON, "vocab_size": VOCAB * 2}, head_dim=32,
                                         tie_word_embeddings=True))
    other.save_pretrained(tmp_path)
    target, _ = models
    with pytest.raises(HeddleError, match="share a tokenizer"):
        make_engine(target, SpeculativeConfig(method="draft", model=str(tmp_path)))
