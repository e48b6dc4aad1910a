"""Which grammar a chat request's output must follow: `tool_choice` and `response_format`.

- `tool_choice: "required"`: one or more calls of the given tools, in the format's own syntax,
  and nothing else (at most one with `parallel_tool_calls: false`);
- a named function: exactly one call of that function;
- `response_format: json_object` / `json_schema`: the content is such JSON;
- otherwise (`auto`, `none`, text): no grammar; under `auto` the text is parsed for calls.

A forced call wins over a response format: a forced call has no content to format.
"""

from __future__ import annotations

from typing import Any

from heddle.errors import InvalidRequestError
from heddle.structured.spec import GrammarSpec
from heddle.tools.base import ToolCallFormat


def forced_function_names(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
) -> list[str] | None:
    """The functions the output must call, or None when calls are not forced."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    names = [t["function"]["name"] for t in tools]
    if tool_choice == "required":
        return names
    if isinstance(tool_choice, dict):
        name = str((tool_choice.get("function") or {}).get("name"))
        if name not in names:
            raise InvalidRequestError(
                f"tool_choice names the function {name!r}, which is not among the tools "
                f"({', '.join(names)})",
                "tool_choice",
            )
        return [name]
    raise InvalidRequestError(f"unknown tool_choice {tool_choice!r}", "tool_choice")


def choose_grammar(
    fmt: ToolCallFormat | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool,
    response_format: dict[str, Any] | None,
) -> GrammarSpec | None:
    forced = forced_function_names(tools, tool_choice)
    if forced is not None:
        assert fmt is not None and tools is not None
        functions = [t["function"] for t in tools if t["function"]["name"] in forced]
        at_most_one = (len(forced) == 1 and tool_choice != "required") or not parallel_tool_calls
        return GrammarSpec.structural_tag(fmt.forced_format(functions, at_most_one))
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    assert response_format is not None
    schema = (response_format.get("json_schema") or {}).get("schema")
    if schema is None:
        return GrammarSpec.json_object()  # OpenAI's json_schema without a schema: any object
    return GrammarSpec.json_schema(schema)
