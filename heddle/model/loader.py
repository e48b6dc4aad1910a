"""One entry point for loading a model: the embedded GGUF, a .gguf file, or a HF directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from heddle.errors import ModelLoadError
from heddle.model.gguf_file import is_gguf
from heddle.model.gguf_loader import load_gguf
from heddle.model.hf_loader import load_hf_dir
from heddle.model.quant import BlockQuantized
from heddle.model.registry import default_model_path, model_name_for
from heddle.model.spec import ModelSpec
from heddle.model.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    name: str  # a short id, e.g. "SmolLM2-135M-Instruct"
    path: Path
    spec: ModelSpec
    weights: dict[str, torch.Tensor]  # Hugging Face names, float32 or the checkpoint's dtype
    tokenizer: Tokenizer | None  # None for a HF directory without tokenizer.json
    # A quantized GGUF's Q4_0 / Q4_1 / Q8_0 matrices as their own blocks (load_model's
    # keep_blocks), in HF names: what quantization="auto" runs.
    blocks: dict[str, BlockQuantized] = field(default_factory=dict)


def load_model(model: str | Path | None, keep_blocks: bool = False) -> LoadedModel:
    """Load weights and tokenizer. Every failure is a ModelLoadError with a one-line message."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            path = ggufs[0]  # a directory holding just one GGUF file
        else:
            spec, weights, tokenizer = load_hf_dir(path)
            return LoadedModel(model_name_for(path), path, spec, weights, tokenizer)
    if not is_gguf(path):
        raise ModelLoadError(
            f"{path} is not a model: expected a .gguf file or a Hugging Face model directory"
        )
    spec, weights, gguf_tokenizer, blocks = load_gguf(path, keep_blocks)
    return LoadedModel(model_name_for(path), path, spec, weights, gguf_tokenizer, blocks)
