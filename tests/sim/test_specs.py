"""Shipped model and hardware specs."""

from __future__ import annotations

import json

import pytest

from heddle.errors import HeddleError
from heddle.sim.specs import hardware_ids, load_hardware_spec, load_model_spec, model_ids


def test_shipped_ids():
    assert model_ids() == [
        "llama-3.1-70b", "llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b", "smollm2-135m"
    ]
    assert hardware_ids() == ["a100", "cpu-2core", "h100", "h200"]


@pytest.mark.parametrize(
    ("model_id", "billions"),
    [
        ("llama-3.1-8b", 8.03),
        ("qwen2.5-7b", 7.62),
        ("llama-3.1-70b", 70.55),
        ("llama-3.2-1b", 1.236),  # tied embeddings
        ("smollm2-135m", 0.1345),
    ],
)
def test_parameter_counts_match_the_published_models(model_id, billions):
    assert load_model_spec(model_id).num_params() / 1e9 == pytest.approx(billions, rel=2e-3)


def test_kv_bytes_per_token():
    spec = load_model_spec("llama-3.1-8b")
    assert spec.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2  # K and V, layers, kv heads, bf16
    assert spec.kv_bytes_per_token(tp=2) == spec.kv_bytes_per_token() // 2
    assert spec.kv_bytes_per_token(tp=16) == spec.kv_bytes_per_token() // 8  # heads replicate


def test_ids_are_case_insensitive_and_errors_list_known_ids():
    assert load_hardware_spec("H100").name == "h100"
    with pytest.raises(HeddleError, match="known ids are a100, cpu-2core, h100, h200"):
        load_hardware_spec("tpu-v5")
    with pytest.raises(HeddleError, match=r"known ids are llama-3\.1-70b, llama-3\.1-8b"):
        load_model_spec("llama-4")


def test_a_spec_can_be_loaded_from_a_path(tmp_path):
    spec = {"name": "mine", "peak_flops": {"bfloat16": 1e12}, "memory_bandwidth": 1e11}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**spec, "memory_bytes": 1e10}))
    assert load_hardware_spec(path).peak_flops == {"bfloat16": 1e12}
    path.write_text(json.dumps({**spec, "memory_bytes": 1e10, "tflops": 3}))
    with pytest.raises(HeddleError, match="unknown fields tflops"):
        load_hardware_spec(path)
    path.write_text(json.dumps({**spec, "memory_bytes": 1e10, "memory_efficiency": 1.5}))
    with pytest.raises(HeddleError, match=r"memory_efficiency must be in \(0, 1\]"):
        load_hardware_spec(path)
