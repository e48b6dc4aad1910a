"""Helpers for comparing our executor with transformers on the same weights."""

from __future__ import annotations

import torch

from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams


def our_last_logits(executor: ModelExecutor, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Prefill each prompt whole, all in one step; logits [vocab] at each last position."""
    builder = OutputBuilder(0)
    next_block = 0
    for index, prompt in enumerate(prompts):
        num_blocks = (len(prompt) + executor.block_size - 1) // executor.block_size
        table = list(range(next_block, next_block + num_blocks))[::-1]  # not a sorted range
        next_block += num_blocks
        new = NewRequest(f"p{index}", list(prompt), len(prompt), table,
                         SamplingParams(temperature=0.0))
        builder.add(f"p{index}", 0, len(prompt), True, num_prompt_tokens=len(prompt),
                    new_request=new)
    logits = executor.compute_logits(builder.build())
    return [logits[f"p{i}"] for i in range(len(prompts))]


def hf_last_logits(model, prompt: list[int]) -> torch.Tensor:  # model: transformers CausalLM
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0, -1].float()


def hf_greedy(model, prompt: list[int], num_new_tokens: int) -> list[int]:
    """transformers' own greedy generate, never stopping early."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=num_new_tokens, eos_token_id=None, pad_token_id=0,
        )
    new_tokens = out[0, len(prompt):].tolist()
    assert len(new_tokens) == num_new_tokens, "transformers stopped early"
    return new_tokens
