"""Through the whole engine: one continuous batch, tiny prefill chunks, preemption, vs transformers.

The reference is transformers loading the same GGUF file (fp32), which no one here wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heddle import LLM, SamplingParams

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
def llm() -> LLM:
    # 16-token prefill chunks and a pool too small for all eight at once: chunking, mixing of
    # prefill and decode, and preemption by recompute all happen in this one batch.
    return LLM(
        dtype="float32", max_num_batched_tokens=16, block_size=16, num_blocks=24, max_num_seqs=8
    )


@pytest.fixture(scope="module")
def reference(llm: LLM) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    path = Path(llm.engine.executor.model_path)  # type: ignore[attr-defined]
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    )
    model.eval()
    outputs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            outputs.append(_greedy(model, llm.tokenizer.encode(prompt), NEW_TOKENS))
    return outputs


def _greedy(model, prompt_ids: list[int], steps: int) -> list[int]:
    """Plain greedy decoding with transformers' KV cache. (`generate(min_new_tokens=...)` would
    suppress EOS, which heddle's ignore_eos does not: it only keeps going after it.)"""
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    tokens: list[int] = []
    for _ in range(steps):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


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
