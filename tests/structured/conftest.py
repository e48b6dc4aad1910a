"""The embedded model's tokenizer (no weights), and a grammar compiler over it."""

from __future__ import annotations

import pytest

from heddle.model.gguf_file import GGUFFile
from heddle.model.gguf_loader import tokenizer_from_gguf
from heddle.structured.compiler import GrammarCompiler


@pytest.fixture(scope="session")
def smol_tokenizer(gguf_path):
    return tokenizer_from_gguf(GGUFFile(gguf_path))


@pytest.fixture(scope="session")
def compiler(smol_tokenizer) -> GrammarCompiler:
    return GrammarCompiler(smol_tokenizer, smol_tokenizer.vocab_size)
