"""Tiny random models that transformers creates and saves (safetensors, no tokenizer), loaded
from their directories: Qwen3 (q/k norm, tied embeddings), Llama with llama3 rope scaling,
Qwen2 (q/k/v bias) and Mistral (sliding window). Logits and greedy continuations, run as one
continuous batch through the ModelExecutor, must match transformers in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor
from tests.model.driver import generate
from tests.model.reference import hf_greedy, hf_last_logits, our_last_logits

VOCAB = 512
NEW_TOKENS = 32
PROMPT_LENGTHS = [1, 3, 8, 15, 17, 33, 50, 97]
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    initializer_range=0.15,  # peaky logits: no near-ties for argmax to fall on
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)
    return Qwen3ForCausalLM(config)


def llama3_scaled():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**COMMON, tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }, rope_theta=500000.0)
    return LlamaForCausalLM(config)


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=False))


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**COMMON, sliding_window=24))


FACTORIES = {"qwen3": qwen3, "llama3": llama3_scaled, "qwen2": qwen2, "mistral": mistral}


# (family, C decode kernel): every family with the kernel where it builds, and the
# plain-torch attention path for two of them.
VARIANTS = [("qwen3", True), ("llama3", True), ("qwen2", True), ("mistral", True),
            ("llama3", False), ("mistral", False)]


@pytest.fixture(scope="module", params=VARIANTS,
                ids=[f"{f}-{'kernel' if k else 'torch'}" for f, k in VARIANTS])
def tiny(request, tmp_path_factory) -> tuple[object, ModelExecutor, str]:
    family, use_kernel = request.param
    torch.manual_seed(sum(map(ord, family)))
    model = FACTORIES[family]().eval()
    path: Path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path)
    executor = ModelExecutor(ModelConfig(model=str(path), dtype="float32",
                                         quantization="none"),
                             CacheConfig(block_size=4, num_blocks=512),
                             use_decode_kernel=use_kernel)
    if not use_kernel:
        assert executor.model.attention.decode_kernel is None
    return model, executor, family


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def test_spec_read_from_config(tiny):
    _model, executor, family = tiny
    spec = executor.spec
    assert spec.family == {"llama3": "llama"}.get(family, family)
    assert spec.qk_norm == (family == "qwen3")
    assert spec.attention_bias == (family == "qwen2")
    assert spec.tie_word_embeddings == (family == "qwen3")
    assert (spec.rope_scaling is not None) == (family == "llama3")
    assert spec.sliding_window == (24 if family == "mistral" else None)
    assert executor.tokenizer is None and executor.eos_token_id is None
    assert executor.model_shape.vocab_size == VOCAB


def test_logits_match_transformers(tiny, prompts):
    model, executor, _ = tiny
    for prompt, logits in zip(prompts, our_last_logits(executor, prompts), strict=True):
        torch.testing.assert_close(logits, hf_last_logits(model, prompt), atol=1e-4, rtol=1e-4)


def test_greedy_continuous_batch_matches_transformers(tiny, prompts):
    model, executor, _ = tiny
    ours = generate(executor, prompts, NEW_TOKENS, chunk_size=16)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(model, prompt, NEW_TOKENS), len(prompt)


def test_broken_step_contract_fails_clearly(tiny):
    from heddle.core.outputs import NewRequest, OutputBuilder, SchedulerOutput
    from heddle.request import SamplingParams

    _, executor, _ = tiny

    def step(start: int, tokens: list[int], table: list[int]) -> SchedulerOutput:
        builder = OutputBuilder(0)
        known = [7] * start + tokens
        new = NewRequest("x", known, 1, table, SamplingParams(temperature=0.0))
        builder.add("x", start, len(tokens), True, num_prompt_tokens=1, new_request=new)
        return builder.build()

    with pytest.raises(ValueError, match="block table"):
        executor.execute(step(0, [1, 2, 3, 4, 5], [0]))  # 5 tokens, one 4-token block
    with pytest.raises(ValueError, match="block id"):
        executor.execute(step(0, [1, 2], [executor.num_blocks]))
    with pytest.raises(ValueError, match="max_model_len"):
        executor.execute(step(512, [1], list(range(129))))
    cached = OutputBuilder(1)
    cached.add("never-sent", 0, 1, True, num_prompt_tokens=1)
    with pytest.raises(ValueError, match="never sent"):
        executor.execute(cached.build())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiny_llama_on_cuda_matches_transformers(tmp_path, prompts):
    torch.manual_seed(1)
    model = llama3_scaled().eval()
    model.save_pretrained(tmp_path)
    executor = ModelExecutor(ModelConfig(model=str(tmp_path), dtype="float32", device="cuda",
                                         quantization="none"),
                             CacheConfig(block_size=4, num_blocks=512))
    for prompt, logits in zip(prompts, our_last_logits(executor, prompts), strict=True):
        torch.testing.assert_close(logits.cpu(), hf_last_logits(model, prompt),
                                   atol=1e-3, rtol=1e-3)
    ours = generate(executor, prompts, 8, chunk_size=16)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(model, prompt, 8)
