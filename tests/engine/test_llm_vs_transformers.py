"""Through the whole engine: one continuous batch, tiny prefill chunks, preemption, vs transformers.

The reference is transformers loading the same GGUF file (fp32), which no one here wrote.
"""

from __future__ import annotations

import pytest

from heddle import LLM, SamplingParams
from heddle.engine.engine import Engine
from heddle.engine.llm import build_config
from tests.model.reference import hf_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "Water boils at",
    "The quick brown fox jumps over the lazy dog. " * 6 + "Then the fox",
    "In machine learning, a transformer is a neural network architecture that relies on "
    "self-attention. Explain in one paragraph why attention scales quadratically with the "
    "sequence length and what that means for long documents:",
    "Q: What is 12 times 12?\nA:",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def llm(smol_executor) -> LLM:
    # The session's model, behind a fresh engine whose scheduler takes 16-token prefill chunks
    # and whose pool (24 blocks of 16) is too small for all eight at once: chunking, mixing of
    # prefill and decode, and preemption by recompute all happen in this one batch.
    config = build_config(max_num_batched_tokens=16, block_size=16, num_blocks=24, max_num_seqs=8)
    engine = Engine(
        config,
        smol_executor,
        num_blocks=24,
        tokenizer=smol_executor.tokenizer,
        eos_token_id=smol_executor.eos_token_id,
        max_model_len=smol_executor.max_model_len,
        vocab_size=smol_executor.model_shape.vocab_size,
    )
    return LLM.from_engine(engine)


@pytest.fixture(scope="module")
def reference(llm: LLM, hf_smol_model) -> list[list[int]]:
    return [hf_greedy(hf_smol_model, llm.tokenizer.encode(p), NEW_TOKENS) for p in PROMPTS]


def test_greedy_continuations_match_transformers_token_for_token(llm, reference):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    preemptions = sum(o.metrics.num_preemptions for o in outputs)
    assert preemptions > 0, "the pool was meant to be too small: preemption must happen"
    for prompt, output, expected in zip(PROMPTS, outputs, reference, strict=True):
        assert output.outputs[0].token_ids == expected, prompt
    llm.engine.check_integrity()


def test_text_is_the_decoded_tokens_and_stop_strings_cut_it(llm, reference):
    text = llm.tokenizer.decode(reference[0])
    stop = text.strip().split()[1] if len(text.split()) > 1 else text[:3]
    (output,) = llm.generate(
        [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, stop=[stop])
    )
    assert output.outputs[0].finish_reason == "stop"
    assert output.outputs[0].stop_reason == stop
    assert stop not in output.outputs[0].text
    assert text.startswith(output.outputs[0].text)


def test_chat_uses_the_template_and_answers(llm):
    (output,) = llm.chat(
        [{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0.0, max_tokens=8)
    )
    assert output.outputs[0].token_ids
    assert output.prompt is not None and "Say hello." in output.prompt
