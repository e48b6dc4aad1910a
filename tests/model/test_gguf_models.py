"""Tiny random models written as GGUF files the way llama.cpp's converter writes them (tensor
names, metadata keys, q/k row permutation for "llama"), then loaded by heddle and compared
with the transformers model they came from. Float32 tensors, so the weights are exact."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor
from tests.model.reference import hf_last_logits, our_last_logits
from tests.model.test_tiny_models import COMMON, VOCAB, qwen2, qwen3

_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(model, arch: str, path: Path) -> None:
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = [f"<t{i}>" for i in range(VOCAB)]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges([])
    writer.add_eos_token_id(0)
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{_LAYER[module]}.{kind}"
            if arch == "llama" and module == "self_attn.q_proj":
                data = llama_cpp_permute(data, config.num_attention_heads)
            elif arch == "llama" and module == "self_attn.k_proj":
                data = llama_cpp_permute(data, config.num_key_value_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=False))


@pytest.mark.parametrize(("factory", "arch"), [(qwen3, "qwen3"), (qwen2, "qwen2"),
                                                (llama, "llama")])
def test_gguf_model_matches_its_transformers_source(tmp_path, factory, arch):
    torch.manual_seed(3)
    model = factory().eval()
    path = tmp_path / "tiny.gguf"
    write_gguf(model, arch, path)
    executor = ModelExecutor(ModelConfig(model=str(path), dtype="float32",
                                         quantization="none"),
                             CacheConfig(block_size=4, num_blocks=128))
    assert executor.spec.qk_norm == (arch == "qwen3")
    assert executor.spec.attention_bias == (arch == "qwen2")
    assert executor.model_name == "tiny"
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (1, 9, 40)]
    for prompt, logits in zip(prompts, our_last_logits(executor, prompts), strict=True):
        torch.testing.assert_close(logits, hf_last_logits(model, prompt), atol=1e-4, rtol=1e-4)
