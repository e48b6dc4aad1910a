"""Session-scoped fixtures shared by every test package: the embedded SmolLM2 model, ours and
transformers' (each loaded once per test run)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor
from heddle.model.registry import default_model_path


def pytest_configure(config: pytest.Config) -> None:
    # quantization auto's kernel plan (heddle/model/tuning_cache.py): a cache of this test run's
    # own, shared with the processes it starts; the user's ~/.cache is neither read nor written.
    if "HEDDLE_TUNING_CACHE" not in os.environ:
        os.environ["HEDDLE_TUNING_CACHE"] = tempfile.mkdtemp(prefix="heddle-tuning-")
        config.stash[_OWN_TUNING_CACHE] = os.environ["HEDDLE_TUNING_CACHE"]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_TUNING_CACHE, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)
        del os.environ["HEDDLE_TUNING_CACHE"]


_OWN_TUNING_CACHE = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def smol_executor() -> ModelExecutor:
    return ModelExecutor(ModelConfig(dtype="float32", quantization="none"),
                         CacheConfig(block_size=16, num_blocks=512))


@pytest.fixture(scope="session")
def hf_smol_model(gguf_path: Path):  # -> transformers LlamaForCausalLM
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    model.generation_config.eos_token_id = None  # compare full-length continuations
    return model.eval()


@pytest.fixture(scope="session")
def hf_smol_tokenizer(gguf_path: Path):  # -> transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
