"""Tool-call formats: parsing edge cases, detection from templates, grammars for forced calls,
and the rendering of tool conversations for templates with and without tool support."""

from __future__ import annotations

import json

import pytest

from heddle.errors import HeddleError, InvalidRequestError
from heddle.structured.spec import GrammarKind
from heddle.tools import detect_format, make_format, resolve_format, template_renders_tools
from heddle.tools.choice import choose_grammar, forced_function_names
from heddle.tools.messages import prepare_messages

HERMES = make_format("hermes")
LLAMA = make_format("llama3_json")
TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "g"}},
]


def calls(message):
    return [(c.name, c.arguments) for c in message.tool_calls]


def test_hermes_content_and_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": "}"}}\n</tool_call>'
    message = HERMES.parse(text)
    assert message.content == "Let me check."
    assert calls(message) == [("f", '{"x": "}"}')]


def test_hermes_arguments_given_as_a_json_string_are_decoded():
    message = HERMES.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert calls(message) == [("f", '{"x": 1}')]


def test_hermes_call_without_arguments_gets_an_empty_object():
    assert calls(HERMES.parse('<tool_call>{"name": "g"}</tool_call>')) == [("g", "{}")]


def test_hermes_malformed_call_is_kept_as_content():
    text = "a <tool_call>not json</tool_call> b"
    message = HERMES.parse(text)
    assert message.tool_calls == [] and message.content == "a<tool_call>not json</tool_call> b"


def test_hermes_missing_end_tag_still_parses():
    message = HERMES.parse('<tool_call>{"name": "f", "arguments": {}}\n<tool_call>{"name": "g"}')
    assert calls(message) == [("f", "{}"), ("g", "{}")]


def test_llama3_plain_json_answer_is_content():
    message = LLAMA.parse('{"answer": 42}')
    assert message.tool_calls == [] and message.content == '{"answer": 42}'


def test_llama3_calls_with_python_tag_and_separator():
    message = LLAMA.parse('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g"}')
    assert calls(message) == [("f", '{"a": 1}'), ("g", "{}")]
    assert message.content is None


def test_ids_are_unique_and_openai_shaped():
    text = '<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g"}</tool_call>'
    message = HERMES.parse(text)
    ids = [c.id for c in message.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert message.tool_calls[0].to_openai() == {
        "id": ids[0], "type": "function", "function": {"name": "f", "arguments": "{}"}
    }


def test_detect_format_from_templates():
    assert detect_format("{{ '<tool_call>' }} {% if tools %}{% endif %}") == "hermes"
    assert detect_format("{{ '<|python_tag|>' }}") == "llama3_json"
    assert detect_format("{{ '<tool_call>' }}{{ '<|python_tag|>' }}") is None  # ambiguous
    assert detect_format(None) is None
    assert resolve_format("auto", "plain {{ messages }}").name == "hermes"  # the default
    assert resolve_format("llama3_json", "{{ '<tool_call>' }}").name == "llama3_json"
    assert template_renders_tools("{% if tools %}x{% endif %}")
    assert not template_renders_tools("{{ messages }}")
    with pytest.raises(HeddleError, match="unknown tool-call parser"):
        make_format("nope")


def test_forced_choices():
    assert forced_function_names(TOOLS, "auto") is None
    assert forced_function_names(TOOLS, "none") is None
    assert forced_function_names(TOOLS, "required") == ["f", "g"]
    assert forced_function_names(TOOLS, {"type": "function", "function": {"name": "g"}}) == ["g"]
    with pytest.raises(InvalidRequestError) as info:
        forced_function_names(TOOLS, {"type": "function", "function": {"name": "h"}})
    assert info.value.param == "tool_choice"


def test_choose_grammar():
    assert choose_grammar(HERMES, TOOLS, "auto", True, None) is None
    required = choose_grammar(HERMES, TOOLS, "required", True, {"type": "json_object"})
    assert required is not None and required.kind is GrammarKind.STRUCTURAL_TAG
    tag = json.loads(required.source)["format"]
    assert tag["at_least_one"] and not tag["stop_after_first"]
    assert [t["begin"] for t in tag["tags"]] == [
        '<tool_call>\n{"name": "f", "arguments": ',
        '<tool_call>\n{"name": "g", "arguments": ',
    ]
    single = choose_grammar(HERMES, TOOLS, "required", False, None)
    assert single is not None and json.loads(single.source)["format"]["stop_after_first"]
    named = choose_grammar(LLAMA, TOOLS, {"type": "function", "function": {"name": "g"}}, True,
                           None)
    assert named is not None
    named_tag = json.loads(named.source)["format"]
    assert named_tag["stop_after_first"] and len(named_tag["tags"]) == 1
    assert named_tag["tags"][0]["begin"] == '{"name": "g", "parameters": '
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    grammar = choose_grammar(None, None, "none", True, fmt)
    assert grammar is not None and grammar.kind is GrammarKind.JSON_SCHEMA
    assert json.loads(grammar.source) == schema
    as_object = choose_grammar(None, None, "none", True, {"type": "json_object"})
    assert as_object is not None and as_object.kind is GrammarKind.JSON_OBJECT


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]


def test_conversation_for_a_template_without_tools():
    messages, extra = prepare_messages(CONVERSATION, TOOLS, HERMES, template_renders_tools=False)
    assert extra == {}
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert '"name": "f"' in messages[0]["content"]
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "f", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert messages[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}
    # The rendered call parses back to the call it came from.
    assert calls(HERMES.parse(messages[2]["content"])) == [("f", '{"city": "Paris"}')]


def test_conversation_for_a_template_with_tools():
    messages, extra = prepare_messages(CONVERSATION, TOOLS, HERMES, template_renders_tools=True)
    assert extra == {"tools": TOOLS}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == CONVERSATION[2]
    assert CONVERSATION[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
