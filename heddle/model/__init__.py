"""The real model: loaders (GGUF, Hugging Face directories), tokenizer, network, executor.

Most modules here import torch. `heddle.model.spec` (ModelSpec, and its `ModelShape`) and
`heddle.model.registry` (default_model_path) do not, so the simulator may use them; keep
this __init__ free of imports for that reason.
"""

from __future__ import annotations
