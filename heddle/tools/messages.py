"""Chat messages with tool calls and tool results, made ready for a model's chat template.

A template that reads `tools` (Qwen2.5's, Llama 3.1's) renders the definitions, the assistant's
`tool_calls` and the `tool` messages itself; it gets the arguments as objects, since templates
serialize them (`tool_call.arguments | tojson`). A template that knows nothing of tools
(SmolLM2's) would drop them silently; for it the conversation is rewritten in the tool-call
format's own text: definitions in the system message, calls in the assistant's content, tool
results as user turns. Either way a multi-turn tool conversation reaches the model whole.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from heddle.tools.base import ToolCallFormat


def prepare_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    fmt: ToolCallFormat,
    template_renders_tools: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for `apply_chat_template`."""
    if template_renders_tools:
        out = [_with_argument_objects(m) for m in messages]
        return out, ({"tools": tools} if tools else {})
    out = [_as_text(m, fmt) for m in messages]
    if tools:
        section = fmt.render_tools(tools)
        if out and out[0].get("role") == "system":
            system = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{system}\n\n{section}" if system else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out, {}


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    return [c for c in calls if isinstance(c, dict)]


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = _calls(message)
    if not calls:
        return message
    converted = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # else the template gets the string
                function["arguments"] = json.loads(arguments)
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


def _as_text(message: dict[str, Any], fmt: ToolCallFormat) -> dict[str, Any]:
    role = message.get("role")
    if role == "tool":
        rest = {k: v for k, v in message.items() if k not in ("tool_call_id", "name")}
        return {**rest, "role": "user", "content": fmt.render_tool_result(message["content"])}
    calls = _calls(message)
    if role != "assistant" or not calls:
        return message
    rendered = fmt.render_calls(
        [
            (
                str((c.get("function") or {}).get("name", "")),
                _arguments_text((c.get("function") or {}).get("arguments")),
            )
            for c in calls
        ]
    )
    content = message.get("content") or ""
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": f"{content}\n{rendered}" if content else rendered}


def _arguments_text(arguments: Any) -> str:
    """JSON text of a call's arguments (OpenAI sends a string; be kind to objects)."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError:
            return json.dumps(arguments)
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
