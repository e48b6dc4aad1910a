"""The fused decode layers (heddle/model/fused_decode.py, csrc/decode_layer.c) compute the same
function as the eager layers: the same decode step run both ways gives identical logits in
bf16 (the C code rounds where each eager op rounds) and float32 logits within 1e-5; steps with
a prefill chunk run eagerly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.model.executor import ModelExecutor
from heddle.model.kernels import load_library
from heddle.request import SamplingParams

pytestmark = pytest.mark.skipif(load_library() is None, reason="no C compiler")

PROMPTS = [5, 16, 33]  # one ends on a block boundary (block_size 4)
HIDDEN = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              initializer_range=0.15, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _model(family: str, path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(3)
    if family == "mistral":  # a sliding window shorter than the longest context
        model = MistralForCausalLM(MistralConfig(**HIDDEN, sliding_window=12))
    else:
        model = LlamaForCausalLM(LlamaConfig(**HIDDEN, tie_word_embeddings=False))
    model.save_pretrained(path)


@pytest.fixture(scope="module", params=[("llama", "bfloat16"), ("llama", "float32"),
                                        ("mistral", "bfloat16")], ids=lambda p: "-".join(p))
def executor(request, tmp_path_factory) -> ModelExecutor:
    family, dtype = request.param
    path = tmp_path_factory.mktemp(family)
    _model(family, path)
    executor = ModelExecutor(ModelConfig(model=str(path), dtype=dtype, quantization="none"),
                             CacheConfig(block_size=4, num_blocks=64))
    assert executor.model.fused is not None
    return executor


class Recorder:
    """Keeps the hidden rows each step hands to the LM head, and whether the fused path ran."""

    def __init__(self, executor: ModelExecutor) -> None:
        self.model = executor.model
        self.logits: list[torch.Tensor] = []
        compute = self.model.compute_logits

        def record(hidden: torch.Tensor) -> torch.Tensor:
            logits = compute(hidden)
            self.logits.append(logits.clone())
            return logits

        self.model.compute_logits = record  # type: ignore[method-assign]


def _requests(executor: ModelExecutor) -> tuple[list[str], list[int]]:
    """Prefill PROMPTS in one step; returns their ids and context lengths."""
    params = SamplingParams(temperature=0.0)
    builder = OutputBuilder(0)
    ids, next_block = [], 0
    for i, length in enumerate(PROMPTS):
        blocks = list(range(next_block, next_block + (length + 8) // 4 + 1))
        next_block += len(blocks)
        tokens = [(7 * i + 3 * t) % 256 for t in range(length)]
        rid = f"r{i}"
        builder.add(rid, 0, length, True, num_prompt_tokens=length,
                    new_request=NewRequest(rid, tokens, length, blocks, params))
        ids.append(rid)
    executor.execute(builder.build())
    return ids, list(PROMPTS)


def test_fused_decode_step_equals_eager(executor):
    recorder = Recorder(executor)
    ids, contexts = _requests(executor)
    for step in range(1, 5):  # four decode steps, each run fused and eagerly at one position
        per_mode = {}
        for fused in (True, False):
            executor.model.fused_enabled = fused
            builder = OutputBuilder(step)
            for rid, context in zip(ids, contexts, strict=True):
                builder.add(rid, context, 1, True, num_prompt_tokens=PROMPTS[int(rid[1:])])
            out = executor.execute(builder.build())
            per_mode[fused] = (recorder.logits[-1], [list(t) for t in out.sampled_token_ids])
            if fused:  # forget the fused run's token: the eager run samples the same position
                for rid in ids:
                    executor._requests[rid].token_ids.pop()
        (fused_logits, fused_tokens), (eager_logits, eager_tokens) = per_mode[True], per_mode[False]
        if executor.dtype == torch.bfloat16:
            assert torch.equal(fused_logits, eager_logits), step
        else:
            torch.testing.assert_close(fused_logits, eager_logits, atol=1e-5, rtol=1e-5)
        assert fused_tokens == eager_tokens
        contexts = [c + 1 for c in contexts]
    executor.model.fused_enabled = True
    executor.execute(OutputBuilder(9).build(finished_request_ids=ids))


def test_steps_with_a_prefill_chunk_run_eagerly(executor, monkeypatch):
    import heddle.model.llama as llama

    calls = []
    monkeypatch.setattr(llama, "run_fused_decode",
                        lambda *a: calls.append(1) or pytest.fail("fused on a prefill"))
    ids, _ = _requests(executor)  # a prefill-only step
    assert calls == []
    executor.execute(OutputBuilder(1).build(finished_request_ids=ids))
