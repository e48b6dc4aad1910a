"""The embedded SmolLM2-135M GGUF, ours vs transformers loading the same file, both fp32.

transformers is the reference no one here wrote: it dequantizes the GGUF, undoes llama.cpp's
q/k permutation and runs its own Llama. Logits must agree within LOGITS_ATOL; greedy
continuations of eight prompts, run as one continuous batch with 16-token prefill chunks
mixed with decodes, must agree token for token.
"""

from __future__ import annotations

import pytest

from tests.model.driver import generate
from tests.model.reference import hf_greedy, hf_last_logits, our_last_logits

pytestmark = pytest.mark.slow

# fp32 vs fp32 through different matmul kernels (oneDNN vs MKL) and attention code: we
# measured a max abs logits difference of ~1e-4 on logits of magnitude ~25.
LOGITS_ATOL = 2e-3

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three colors:",
    "Water boils at",
    "The quick brown fox jumps over the lazy dog. " * 8 + "Then the fox",
    "In machine learning, a transformer is a neural network architecture that relies on "
    "self-attention. Explain why attention scales quadratically with sequence length:",
    "Q: What is 12 times 12?\nA:",
    "日本の首都は",
    "x",
]
CHAT = [[{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name a prime number bigger than 10."}]]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompt_ids(smol_executor) -> list[list[int]]:
    tokenizer = smol_executor.tokenizer
    ids = [tokenizer.encode(p) for p in PROMPTS]
    ids += [tokenizer.encode(tokenizer.apply_chat_template(m)) for m in CHAT]
    return ids


def test_executor_describes_the_embedded_model(smol_executor):
    assert smol_executor.model_name == "SmolLM2-135M-Instruct"
    assert smol_executor.max_model_len == 8192
    assert smol_executor.eos_token_id == 2
    shape = smol_executor.model_shape
    sizes = (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads)
    assert sizes == (30, 576, 9, 3)
    assert (shape.head_dim, shape.intermediate_size, shape.vocab_size) == (64, 1536, 49152)
    assert shape.dtype_bytes == 4
    assert len(smol_executor.kv_caches) == 30
    assert smol_executor.kv_caches[0].shape == (2, 3, 512, 16, 64)


def test_last_position_logits_match_transformers(smol_executor, hf_smol_model, prompt_ids):
    ours = our_last_logits(smol_executor, prompt_ids[:6])
    worst = 0.0
    for prompt, logits in zip(prompt_ids, ours, strict=False):
        reference = hf_last_logits(hf_smol_model, prompt)
        worst = max(worst, (logits - reference).abs().max().item())
        assert logits.argmax().item() == reference.argmax().item()
    assert worst < LOGITS_ATOL, f"max abs logits difference {worst}"


def test_greedy_continuous_batch_matches_transformers_generate(
    smol_executor, hf_smol_model, prompt_ids
):
    assert len(prompt_ids) >= 8
    ours = generate(smol_executor, prompt_ids, NEW_TOKENS, chunk_size=16)
    for prompt, tokens in zip(prompt_ids, ours, strict=True):
        assert tokens == hf_greedy(hf_smol_model, prompt, NEW_TOKENS), prompt
