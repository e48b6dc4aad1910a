"""A tiny random Qwen3 with a tokenizer and a thinking chat template, written by transformers.

The tokenizer is a byte-level BPE trained on a few lines (so decoding gives real text), with
Qwen's role markers and `<think>` / `</think>` as added, non-special tokens as in Qwen3's own
tokenizer. Two templates: Qwen3's (the model opens the block itself; `enable_thinking=false`
writes an empty block) and DeepSeek-R1's (the generation prompt opens the block).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 512

QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
R1_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
TEMPLATES = {"qwen3": QWEN3_TEMPLATE, "deepseek_r1": R1_TEMPLATE}

CORPUS = [
    "Let me think about this step by step. First, add the numbers; then check the sum.",
    "The answer is 5. Two plus three equals five, which is what we wanted to show.",
    "Hello! How can I help you today? I can answer questions, write code and explain ideas.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
] * 8


def write_tiny_thinking_model(path: Path, template: str = "qwen3", seed: int = 0) -> Path:
    """Save the model, tokenizer and template under `path`; returns `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 16,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_tokens(["<think>", "</think>"])  # added, not special: they stay in the text
    tokenizer.chat_template = TEMPLATES[template]
    tokenizer.save_pretrained(path)
    assert len(tokenizer) <= VOCAB

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        tie_word_embeddings=True, rope_theta=1e6, initializer_range=0.15,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
    )
    Qwen3ForCausalLM(config).eval().save_pretrained(path)
    return path
