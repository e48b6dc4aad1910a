"""One description of a model's shape for the real executor and the cost models."""

from __future__ import annotations

import dataclasses

import pytest

from heddle.errors import HeddleError
from heddle.model.gguf_file import GGUFFile
from heddle.model.gguf_loader import spec_from_gguf
from heddle.model.registry import default_model_path
from heddle.model_shape import ModelShape
from heddle.sim.specs import load_model_spec


def test_the_loaded_network_and_the_shipped_spec_have_one_shape():
    """The embedded GGUF's hyperparameters, as the executor sees them, give the same
    ModelShape as the simulator's `smollm2-135m` spec file (the spec's provenance aside)."""
    gguf = GGUFFile(default_model_path())
    try:
        network = spec_from_gguf(gguf)
    finally:
        gguf.close()
    shipped = load_model_spec("smollm2-135m")
    loaded = network.shape("smollm2-135m", shipped.dtype)
    assert dataclasses.replace(loaded, source=shipped.source) == shipped
    assert loaded.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 2  # K+V, layers, kv heads, head, bf16
    assert network.shape("x", "float32").kv_bytes_per_token() == 2 * loaded.kv_bytes_per_token()


def test_kv_blocks_in_memory():
    shape = load_model_spec("llama-3.1-8b")  # 128 KiB of K and V per token in bf16
    assert shape.kv_blocks_in(1 << 30, block_size=16) == (1 << 30) // (16 * 131072) == 512
    assert shape.kv_blocks_in(1 << 30, block_size=16, tp=2) == 1024
    with pytest.raises(HeddleError):
        shape.kv_blocks_in(1 << 30, block_size=0)


def test_bad_shapes_are_refused():
    good = dict(name="m", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                head_dim=16, intermediate_size=128, vocab_size=100)  # fmt: skip
    assert ModelShape(**good).q_size == 64
    with pytest.raises(HeddleError, match="num_heads must divide"):
        ModelShape(**{**good, "num_kv_heads": 3})
    with pytest.raises(HeddleError, match="unknown dtype"):
        ModelShape(**good, dtype="int3")
