"""Tool conversations through real chat templates: SmolLM2's (no tool support: heddle writes
the tools and calls in the Hermes form) and a Qwen2.5-style one (renders them itself), each
checked against transformers' rendering of the same messages."""

from __future__ import annotations

import pytest

from heddle.model.gguf_file import GGUFFile
from heddle.model.gguf_loader import tokenizer_from_gguf
from heddle.model.tokenizer import Tokenizer
from heddle.tools import resolve_format, template_renders_tools
from heddle.tools.messages import prepare_messages
from tests.tools.qwen_template import QWEN25_TEMPLATE

pytestmark = pytest.mark.slow  # transformers' tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
]


@pytest.fixture(scope="module")
def smol(gguf_path) -> Tokenizer:
    return tokenizer_from_gguf(GGUFFile(gguf_path))


def render(tokenizer, template: str | None = None):
    """(heddle's rendering, transformers' rendering of the same prepared messages)."""
    template = template or tokenizer.chat_template
    heddle_tokenizer = Tokenizer(
        tokenizer.backend, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, chat_template=template,
    )
    fmt = resolve_format("auto", template)
    messages, extra = prepare_messages(CONVERSATION, TOOLS, fmt, template_renders_tools(template))
    return heddle_tokenizer.apply_chat_template(messages, **extra), messages, extra


def test_smollm2_template_sees_tools_calls_and_results(smol, hf_smol_tokenizer):
    text, messages, extra = render(smol)
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert CALL_TEXT in text
    assert '<tool_response>\n{"celsius": 21}\n</tool_response>' in text
    assert text.endswith("<|im_start|>assistant\n")
    reference = hf_smol_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **extra
    )
    assert text == reference


def test_qwen_style_template_renders_the_conversation_itself(smol, hf_smol_tokenizer):
    text, messages, extra = render(smol, QWEN25_TEMPLATE)
    assert extra == {"tools": TOOLS}
    assert CALL_TEXT in text
    assert "<|im_start|>user\n<tool_response>\n{\"celsius\": 21}\n</tool_response>" in text
    reference = hf_smol_tokenizer.apply_chat_template(
        messages, tools=TOOLS, chat_template=QWEN25_TEMPLATE, tokenize=False,
        add_generation_prompt=True,
    )
    assert text == reference
