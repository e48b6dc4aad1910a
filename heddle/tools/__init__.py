"""Tool calls: parsers of each model family's tool-call text, and their grammars.

`make_format(name)` gives a `ToolCallFormat` by name (`--tool-call-parser`);
`detect_format(chat_template)` picks one from a chat template where that is unambiguous.
"""

from __future__ import annotations

from heddle.errors import HeddleError
from heddle.tools.base import (
    ParseDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    ToolCallFormat,
    ToolCallStream,
    new_call_id,
)
from heddle.tools.hermes import HermesFormat
from heddle.tools.llama3 import Llama3JsonFormat

AUTO = "auto"
FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat,
    "qwen2_5": HermesFormat,  # Qwen2.5 writes the Hermes form
    "llama3_json": Llama3JsonFormat,
}
# What heddle falls back to when a template shows no tool syntax: heddle then renders the
# tool definitions itself (see heddle.tools.messages), in this form.
DEFAULT_FORMAT = "hermes"


def make_format(name: str) -> ToolCallFormat:
    cls = FORMATS.get(name)
    if cls is None:
        known = ", ".join([AUTO, *FORMATS])
        raise HeddleError(f"unknown tool-call parser {name!r}; known: {known}")
    return cls()


def detect_format(chat_template: str | None) -> str | None:
    """The format a chat template writes tool calls in, when only one fits; else None."""
    if not chat_template:
        return None
    found = []
    if "<tool_call>" in chat_template:
        found.append("hermes")
    if "<|python_tag|>" in chat_template or '"parameters": ' in chat_template:
        found.append("llama3_json")
    return found[0] if len(found) == 1 else None


def resolve_format(name: str, chat_template: str | None) -> ToolCallFormat:
    """`name` itself, or for "auto" the template's format (the default when it shows none)."""
    if name != AUTO:
        return make_format(name)
    return make_format(detect_format(chat_template) or DEFAULT_FORMAT)


def template_renders_tools(chat_template: str | None) -> bool:
    """Whether the template itself shows the model its tools (it reads a `tools` variable)."""
    return bool(chat_template) and "tools" in (chat_template or "")


__all__ = [
    "AUTO",
    "DEFAULT_FORMAT",
    "FORMATS",
    "ParseDelta",
    "ParsedMessage",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFormat",
    "ToolCallStream",
    "detect_format",
    "make_format",
    "new_call_id",
    "resolve_format",
    "template_renders_tools",
]
