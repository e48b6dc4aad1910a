"""Grammars inside the batch, on the real embedded model: valid output, state freed on abort
and finish, and preemption by recompute leaves each matcher where its output is."""

from __future__ import annotations

import json

import jsonschema
import pytest

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.errors import InvalidRequestError
from heddle.request import SamplingParams
from heddle.structured.spec import GrammarSpec

pytestmark = pytest.mark.slow

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "count", "color"],
}


def make_engine(executor, num_blocks: int, max_num_seqs: int = 8) -> Engine:
    config = EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=512),
    )
    return Engine(
        config,
        executor,
        num_blocks=num_blocks,
        tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id,
        max_model_len=executor.max_model_len,
        vocab_size=executor.model_shape.vocab_size,
    )


def prompt(executor, text: str) -> list[int]:
    tokenizer = executor.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def run_all(engine: Engine, check=None, max_steps: int = 2000) -> dict:
    finals = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
        if check is not None:
            check(engine)
    assert not engine.has_unfinished_requests()
    return finals


def test_constrained_and_free_sequences_share_a_batch(smol_executor):
    engine = make_engine(smol_executor, num_blocks=128)
    ids = prompt(smol_executor, "Describe an item as JSON.")
    spec = GrammarSpec.json_schema(ITEM)
    for i in range(3):
        params = SamplingParams(max_tokens=60, temperature=0.8, seed=i)
        engine.add_request(f"c{i}", ids, params, grammar=spec)
        engine.add_request(f"f{i}", ids, SamplingParams(max_tokens=20, temperature=0.8, seed=i))
    finals = run_all(engine)
    for i in range(3):
        text = finals[f"c{i}"].outputs[0].text
        jsonschema.validate(json.loads(text), ITEM)
        assert finals[f"c{i}"].outputs[0].finish_reason == "stop"
    assert engine.grammars is not None and len(engine.grammars) == 0
    assert engine.grammars.compiler.num_compiled == 1  # one schema, three sequences
    engine.check_integrity()


def test_invalid_schema_is_rejected_before_queueing(smol_executor):
    engine = make_engine(smol_executor, num_blocks=32)
    with pytest.raises(InvalidRequestError):
        engine.add_request("bad", [1, 2, 3], SamplingParams(),
                           grammar=GrammarSpec.json_schema({"type": "nope"}))
    assert not engine.has_unfinished_requests()


def test_abort_frees_the_matcher(smol_executor):
    engine = make_engine(smol_executor, num_blocks=32)
    ids = prompt(smol_executor, "JSON please.")
    engine.add_request("a", ids, SamplingParams(max_tokens=50, n=2, seed=1, temperature=1.0),
                       grammar=GrammarSpec.json_object())
    for _ in range(3):
        engine.step()
    assert engine.grammars is not None and len(engine.grammars) == 2  # one per sequence
    engine.abort_request("a")
    assert len(engine.grammars) == 0
    engine.check_integrity()


def test_preemption_keeps_each_matcher_in_step_with_its_output(smol_executor):
    # Four constrained requests in a cache too small for all of them: preemption by
    # recompute happens; after every step each matcher has consumed exactly the request's
    # output tokens (no more: a token sampled for a preempted request is never accepted).
    engine = make_engine(smol_executor, num_blocks=14, max_num_seqs=4)
    spec = GrammarSpec.json_schema(ITEM)
    ids = prompt(smol_executor, "Describe an item as JSON, with a long name.")
    for i in range(4):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=60, temperature=1.0, seed=i),
                           grammar=spec)

    def check(engine: Engine) -> None:
        grammars = engine.grammars
        assert grammars is not None
        for request in engine.scheduler.requests.values():
            assert grammars.num_accepted(request.request_id) == request.num_output_tokens

    finals = run_all(engine, check)
    assert engine.scheduler.num_preemptions > 0
    for output in finals.values():
        completion = output.outputs[0]
        if completion.finish_reason == "stop":
            jsonschema.validate(json.loads(completion.text), ITEM)
    assert len(engine.grammars) == 0
    engine.check_integrity()
