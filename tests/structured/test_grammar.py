"""Grammar compilation (cached, bad schemas rejected) and per-sequence matchers."""

from __future__ import annotations

import json

import pytest
import torch

from heddle.errors import InvalidRequestError
from heddle.model.sampler import apply_token_bitmask
from heddle.structured.compiler import GrammarCompiler
from heddle.structured.matchers import GrammarMatchers
from heddle.structured.spec import GrammarKind, GrammarSpec
from heddle.tools import make_format

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def allowed(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool [vocab]: which tokens a packed bitmask row allows."""
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab].bool()


def test_specs_are_cache_keys_that_keep_property_order():
    a = GrammarSpec.json_schema(json.loads('{"b": 1, "a": {"y": 2, "x": 3}}'))
    b = GrammarSpec.json_schema(json.loads('{"b": 1,  "a": {"y": 2, "x": 3}}'))
    assert a == b and hash(a) == hash(b) and a.kind is GrammarKind.JSON_SCHEMA
    assert GrammarSpec.json_schema({"a": {"y": 2, "x": 3}, "b": 1}) != a


def test_a_schema_is_compiled_once(smol_tokenizer):
    compiler = GrammarCompiler(smol_tokenizer, smol_tokenizer.vocab_size, cache_size=2)
    first = compiler.compile(GrammarSpec.json_schema(PERSON))
    again = compiler.compile(GrammarSpec.json_schema(json.loads(json.dumps(PERSON))))
    assert again is first
    assert (compiler.num_compiled, compiler.num_hits) == (1, 1)
    compiler.compile(GrammarSpec.json_object())
    compiler.compile(GrammarSpec.json_schema({"type": "integer"}))  # evicts PERSON (LRU)
    compiler.compile(GrammarSpec.json_schema(PERSON))
    assert compiler.num_compiled == 4


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "foo"}, "invalid JSON schema"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
        ({"type": "string", "pattern": "(["}, "regex"),
        ({"type": "object", "required": "name"}, "invalid JSON schema"),
    ],
)
def test_bad_schemas_are_rejected_with_a_reason(compiler, schema, words):
    with pytest.raises(InvalidRequestError) as info:
        compiler.compile(GrammarSpec.json_schema(schema), "response_format")
    assert words in str(info.value) and info.value.param == "response_format"
    assert "/project/cpp" not in str(info.value)  # no C++ source locations for users


def test_matcher_masks_and_follows_a_schema(smol_tokenizer, compiler):
    matchers = GrammarMatchers(compiler)
    matchers.add("r1", GrammarSpec.json_schema(PERSON))
    vocab = smol_tokenizer.vocab_size
    step = matchers.start_step(["r1"])
    mask = allowed(step.wait()["r1"], vocab)  # the step's token_masks: id -> its row
    assert mask[smol_tokenizer.encode("{")[0]]
    assert not mask[smol_tokenizer.encode("hello")[0]]
    text = json.dumps({"name": "Ada", "age": 36})
    ids = smol_tokenizer.encode(text)
    assert matchers.accept("r1", ids)
    assert matchers.num_accepted("r1") == len(ids)
    # Complete: only the end of the sequence is allowed now.
    mask = allowed(matchers.start_step(["r1"], overlap=False).wait()["r1"], vocab)
    assert mask.nonzero().flatten().tolist() == [smol_tokenizer.eos_token_id]
    assert matchers.accept("r1", [*ids, smol_tokenizer.eos_token_id])
    assert matchers.is_terminated("r1")
    matchers.remove("r1")
    assert len(matchers) == 0
    matchers.close()


def test_a_rejected_token_is_not_consumed(smol_tokenizer, compiler):
    matchers = GrammarMatchers(compiler)
    matchers.add("r", GrammarSpec.json_object())
    ids = smol_tokenizer.encode('{"a": 1}')
    assert not matchers.accept("r", [*smol_tokenizer.encode("x"), *ids])
    assert matchers.num_accepted("r") == 0
    assert matchers.accept("r", ids)


def test_forced_hermes_call_grammar(smol_tokenizer, compiler):
    fmt = make_format("hermes")
    functions = [{"name": "get_weather", "parameters": PERSON}]
    spec = GrammarSpec.structural_tag(fmt.forced_format(functions, at_most_one=True))
    matchers = GrammarMatchers(compiler)
    matchers.add("r", spec)
    good = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"name": "x", "age": 3}}\n'
        "</tool_call>"
    )
    assert matchers.accept("r", smol_tokenizer.encode(good))
    matchers.add("bad", spec)
    assert not matchers.accept("bad", smol_tokenizer.encode('<tool_call>\n{"name": "other"'))


def test_apply_token_bitmask_matches_a_naive_mask():
    torch.manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(3, vocab)
    keep = torch.rand(2, vocab) < 0.3
    words = (vocab + 31) // 32
    bitmask = torch.zeros(2, words, dtype=torch.int32)
    for r in range(2):
        for j in range(vocab):
            if keep[r, j]:
                bitmask[r, j // 32] |= torch.tensor(1 << (j % 32), dtype=torch.int64).to(
                    torch.int32
                )
    expected = logits.clone()
    expected[2] = expected[2].masked_fill(~keep[0], float("-inf"))
    expected[0] = expected[0].masked_fill(~keep[1], float("-inf"))
    apply_token_bitmask(logits, [2, 0], bitmask)
    assert torch.equal(logits, expected)
