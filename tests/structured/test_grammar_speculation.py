"""Grammars and speculative decoding: the executor verifies draft tokens without a grammar's
mask, so a constrained request never gets drafts (the speculator skips it), and its output
still follows its schema while the free requests beside it speculate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import ExecutorOutput
from heddle.core.scheduler import Scheduler
from heddle.engine.engine import Engine
from heddle.request import Request, SamplingParams
from heddle.structured.spec import GrammarSpec

NGRAM = SpeculativeConfig(method="ngram", num_draft_tokens=4, adaptive=False)
ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
    },
    "required": ["name", "count", "tags"],
}


def test_the_speculator_gives_no_drafts_to_a_constrained_request():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, speculation=NGRAM)
    s = Scheduler(config, KVCacheManager(32, 4, True), VirtualClock())
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    for request_id, grammar in (("free", None), ("json", GrammarSpec.json_object())):
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        s.add_request(Request(request_id, list(prompt), params, 0.0, eos_token_id=2,
                              grammar=grammar))
    drafted: dict[str, int] = {"free": 0, "json": 0}
    for _ in range(4):
        so = s.schedule()
        for request_id in so.draft_token_ids:
            drafted[request_id] += 1
        # Each row answers the token prompt lookup expects next (7 after "5 6"): drafts fit.
        sampled = [[*so.draft_token_ids.get(rid, []), 7] if sample else []
                   for rid, sample in zip(so.request_ids, so.sample, strict=True)]
        s.update(so, ExecutorOutput(sampled, 0.01))
        s.check_integrity()
    assert drafted["free"] > 0 and drafted["json"] == 0


@pytest.mark.slow
def test_a_json_schema_request_validates_with_speculation_on(smol_executor, monkeypatch):
    drafted: set[str] = set()
    execute = smol_executor.execute

    def spy(scheduler_output):
        drafted.update(scheduler_output.draft_token_ids)
        return execute(scheduler_output)

    monkeypatch.setattr(smol_executor, "execute", spy)
    config = EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=128),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, speculation=NGRAM),
    )
    engine = Engine(config, smol_executor, num_blocks=128, tokenizer=smol_executor.tokenizer,
                    eos_token_id=smol_executor.eos_token_id,
                    max_model_len=smol_executor.max_model_len,
                    vocab_size=smol_executor.model_shape.vocab_size)
    tokenizer = smol_executor.tokenizer
    # A prompt full of text to copy: prompt lookup finds drafts for every request.
    example = '{"name": "lamp", "count": 3, "tags": ["red", "blue"]} ' * 4
    text = f"Repeat this JSON exactly: {example}"
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
    spec = GrammarSpec.json_schema(ITEM)
    engine.add_request("json", ids, SamplingParams(temperature=0.0, max_tokens=48), grammar=spec)
    engine.add_request("free", ids, SamplingParams(temperature=0.0, max_tokens=24))
    finals = {}
    for _ in range(400):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    assert not engine.has_unfinished_requests()
    speculator = engine.scheduler.speculator
    assert speculator is not None and speculator.acceptance.num_accepted > 0
    assert drafted == {"free"}
    out = finals["json"].outputs[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), ITEM)
    assert engine.grammars is not None and len(engine.grammars) == 0
    engine.check_integrity()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
