"""The real model: loaders (GGUF, Hugging Face directories), tokenizer, network, executor.

Importing this package pulls in torch; the scheduler and the simulator never do.
"""

from __future__ import annotations
