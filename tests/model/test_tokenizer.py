"""Our GGUF-built tokenizer vs transformers' tokenizer for the same GGUF file."""

from __future__ import annotations

import random

import pytest

from heddle.errors import InvalidRequestError
from heddle.model.gguf_file import GGUFFile
from heddle.model.gguf_loader import tokenizer_from_gguf
from heddle.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "",
    "Hello, world!",
    "Hello world 12345 3.14159 -7e10 1,000,000",
    "  leading spaces, trailing spaces   ",
    "multiple   spaces\n\n\nnewlines\ttabs\t\t and \r\n windows line ends",
    "héllo naïve café façade — “quotes” ‘single’ …",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 🤗🚀👩‍👩‍👧‍👦 and flags 🇫🇷",
    "Ünïcödé ÀÉÎÕÜ ß ẞ Ωμέγα Кириллица עברית العربية",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "text with <|im_start|> inside and <repo_name> too",
    "don't won't it's I'M we'll they'd you've",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "a" * 300,
    " " * 17 + "x",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Tell me a joke 😀"}],
]


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    gguf = GGUFFile(gguf_path)
    try:
        return tokenizer_from_gguf(gguf)
    finally:
        gguf.close()


def test_special_ids_and_vocab(tokenizer, hf_smol_tokenizer):
    assert tokenizer.bos_token_id == hf_smol_tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_id == hf_smol_tokenizer.eos_token_id == 2
    assert tokenizer.vocab_size == len(hf_smol_tokenizer) == 49152
    assert set(hf_smol_tokenizer.all_special_ids) <= set(tokenizer.all_special_ids)
    assert tokenizer.all_special_ids == list(range(17))  # the 17 control tokens of SmolLM2


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tokenizer, hf_smol_tokenizer, text):
    for add_special_tokens in (False, True):
        expected = hf_smol_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        assert tokenizer.encode(text, add_special_tokens=add_special_tokens) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers_and_round_trips(tokenizer, hf_smol_tokenizer, text):
    ids = hf_smol_tokenizer.encode(text, add_special_tokens=False)
    for skip in (False, True):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == hf_smol_tokenizer.decode(
            ids, skip_special_tokens=skip
        )
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_decode_arbitrary_ids_matches_transformers(tokenizer, hf_smol_tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == hf_smol_tokenizer.decode(
                ids, skip_special_tokens=skip
            )


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(tokenizer, hf_smol_tokenizer, messages):
    for add_generation_prompt in (True, False):
        ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        expected = hf_smol_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert ours == expected
        assert tokenizer.encode(ours) == hf_smol_tokenizer.encode(ours, add_special_tokens=False)
    assert ours.startswith("<|im_start|>")


def test_chat_template_errors_are_invalid_requests(tokenizer):
    broken = Tokenizer(tokenizer.backend, bos_token_id=1, eos_token_id=2,
                       chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(InvalidRequestError, match="no system role"):
        broken.apply_chat_template([{"role": "user", "content": "x"}])
    without = Tokenizer(tokenizer.backend, bos_token_id=1, eos_token_id=2)
    with pytest.raises(InvalidRequestError, match="no chat template"):
        without.apply_chat_template([{"role": "user", "content": "x"}])
