"""Prompt-lookup speculation through the real engine and model (the embedded SmolLM2):
greedy outputs are token for token those without speculation, with preemption, chunked
prefill, the prefix cache, stop strings and streamed outputs all in the same batch."""

from __future__ import annotations

import pytest

from heddle import LLM, SamplingParams
from heddle.config import SpeculativeConfig
from heddle.engine.engine import Engine
from heddle.engine.llm import build_config

pytestmark = pytest.mark.slow

CODE = (
    "def area(w, h):\n    return w * h\n\n"
    "def perimeter(w, h):\n    return 2 * (w + h)\n\n"
)
PROMPTS = [
    f"Here is some code:\n{CODE}Repeat the code exactly:\n{CODE[:40]}",
    "Copy this text: the cat sat on the mat. the cat sat on the mat. the cat sat on the",
    "List the numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,",
    f"Here is some code:\n{CODE}Repeat the code exactly:\n{CODE[:20]}",  # shares a prefix
]
NEW_TOKENS = 24
NUM_BLOCKS = 12


def engine(executor, speculation: SpeculativeConfig | None) -> LLM:
    # 32-token chunks and a pool (12 blocks of 16) too small for all four at once: chunking,
    # preemption by recompute and prefix-cache hits happen while requests speculate.
    kwargs = {"speculation": speculation} if speculation is not None else {}
    config = build_config(max_num_batched_tokens=32, block_size=16, num_blocks=NUM_BLOCKS,
                          max_num_seqs=4, **kwargs)
    return LLM.from_engine(Engine(
        config, executor, num_blocks=NUM_BLOCKS, tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id, max_model_len=executor.max_model_len,
        vocab_size=executor.model_shape.vocab_size,
    ))


@pytest.fixture(scope="module")
def reference(smol_executor):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in engine(smol_executor, None).generate(PROMPTS, params)]


def test_greedy_outputs_are_identical_with_prompt_lookup(smol_executor, reference):
    llm = engine(smol_executor, SpeculativeConfig(method="ngram", num_draft_tokens=4))
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    for prompt, output, expected in zip(PROMPTS, outputs, reference, strict=True):
        assert output.outputs[0].token_ids == expected, prompt
    spec = llm.engine.scheduler.speculator
    assert spec is not None and spec.acceptance.num_accepted > 0
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    llm.engine.check_integrity()
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.num_blocks


def test_stop_strings_and_streaming_with_runs_of_several_tokens(smol_executor, reference):
    llm = engine(smol_executor, SpeculativeConfig(method="ngram", adaptive=False))
    text = llm.tokenizer.decode(reference[2])
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    (output,) = llm.generate([PROMPTS[2]], SamplingParams(temperature=0.0,
                                                          max_tokens=NEW_TOKENS, stop=[stop]))
    assert output.outputs[0].text == text[: text.index(stop)]
    # Streamed: the deltas add up to the whole output; some deltas carry several tokens.
    engine_ = llm.engine
    engine_.add_request("s", llm.tokenizer.encode(PROMPTS[1]),
                        SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    sizes = []
    tokens: list[int] = []
    while engine_.has_unfinished_requests():
        for out in engine_.step():
            new = out.outputs[0].token_ids[len(tokens):]
            sizes.append(len(new))
            tokens.extend(new)
    assert tokens == reference[1] and max(sizes) > 1
