"""Tool calls and structured outputs through the official openai client, against a live server
with the real embedded model (SmolLM2-135M: it only calls tools reliably when forced)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.server.live import LiveServer, real_engine

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -999, "maximum": 999},
                "b": {"type": "integer", "minimum": -999, "maximum": 999},
            },
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
            }
        },
        "required": ["user"],
    },
    "enum": {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad", "calm"]}, "ok": {"type": "boolean"}},
        "required": ["mood", "ok"],
    },
    "array": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"type": "string", "maxLength": 10},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["colors"],
    },
}


@pytest.fixture(scope="module")
def server():
    live = LiveServer(real_engine(max_num_seqs=8)).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def create(client, **kwargs):
    kwargs.setdefault("model", "SmolLM2-135M-Instruct")
    kwargs.setdefault("max_tokens", 80)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(**kwargs)


def test_required_tool_call_validates_against_its_schema(client):
    reply = create(client, messages=ASK, tools=TOOLS, tool_choice="required",
                   parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))
    assert not choice.message.content  # the grammar allows nothing but calls


def test_required_parallel_calls_each_validate(client):
    # With parallel calls allowed, the 135M model tends to repeat its call until max_tokens:
    # every call it completed validates; only a call cut off by the length limit may not.
    reply = create(client, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120)
    choice = reply.choices[0]
    calls = choice.message.tool_calls
    assert calls and choice.finish_reason in ("tool_calls", "length")
    complete = calls if choice.finish_reason == "tool_calls" else calls[:-1]
    for call in complete:
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))


def test_named_function_is_called(client):
    reply = create(
        client,
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    calls = reply.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["add"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema_of("add"))
    assert reply.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_never_returns_calls(client):
    for seed in range(3):
        reply = create(client, messages=ASK, tools=TOOLS, tool_choice="none",
                       temperature=1.0, seed=seed, max_tokens=40)
        assert reply.choices[0].message.tool_calls is None
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_streamed_calls_equal_non_streamed(client):
    kwargs = dict(messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120)
    whole_choice = create(client, **kwargs).choices[0]
    whole, whole_finish = whole_choice.message.tool_calls, whole_choice.finish_reason
    chunks = list(create(client, **kwargs, stream=True))
    calls: dict[int, dict] = {}
    content = ""
    finish = None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            if piece.index not in calls:
                assert piece.id and piece.function.name  # id and name come first
                calls[piece.index] = {"id": piece.id, "name": piece.function.name, "args": ""}
            calls[piece.index]["args"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole_finish
    assert content == ""  # no markup of the call syntax leaks into content
    assert [(c["name"], c["args"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def streamed_calls(chunks) -> tuple[list[tuple[str, str]], str, str | None]:
    calls: dict[int, list[str]] = {}
    content, finish = "", None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, [piece.function.name, ""])
            call[1] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [(name, args) for name, args in calls.values()], content, finish


def test_a_call_cut_by_max_tokens_is_returned_as_written_with_finish_reason_length(client):
    # As the OpenAI API does: the call the model was writing when max_tokens hit is returned
    # with the arguments written so far (not valid JSON), and finish_reason stays "length"
    # (never "tool_calls"), so a client knows not to run it. Streamed and not, the same.
    named = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = dict(messages=ASK, tools=TOOLS, tool_choice=named)
    full = create(client, **kwargs)
    [whole] = full.choices[0].message.tool_calls
    assert full.choices[0].finish_reason == "tool_calls"
    # Cut earlier and earlier until the cut falls inside the arguments (not only the end tag).
    for cut_at in range(full.usage.completion_tokens - 4, 0, -3):
        cut = create(client, **kwargs, max_tokens=cut_at)
        choice = cut.choices[0]
        assert choice.finish_reason == "length" and cut.usage.completion_tokens == cut_at
        [call] = choice.message.tool_calls
        args = call.function.arguments
        assert call.function.name == "get_weather" and whole.function.arguments.startswith(args)
        if args != whole.function.arguments:
            break
    assert args and args != whole.function.arguments
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)
    assert not choice.message.content
    calls, content, finish = streamed_calls(create(client, **kwargs, max_tokens=cut_at,
                                                   stream=True))
    assert (calls, content, finish) == ([("get_weather", args)], "", "length")


def test_two_turn_conversation_with_a_tool_message(server, client):
    first = create(client, messages=ASK, tools=[WEATHER], tool_choice="required",
                   parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = create(client, messages=messages, tools=[WEATHER], tool_choice="none")
    assert second.choices[0].message.content
    # The call and its result reached the prompt: it grew by at least their tokens.
    tokenizer = server.engine.tokenizer
    grown = len(tokenizer.encode(call.function.arguments + '{"temperature": 21}'))
    assert second.usage.prompt_tokens >= first.usage.prompt_tokens + grown


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_response_validates(client, name):
    schema = SCHEMAS[name]
    for seed in range(2):
        reply = create(
            client,
            messages=[{"role": "user", "content": f"Give an example {name} object as JSON."}],
            response_format={
                "type": "json_schema", "json_schema": {"name": name, "schema": schema}
            },
            temperature=0.7,
            seed=seed,
            max_tokens=120,
        )
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_json_object_response(client):
    # Any object is allowed, strings unbounded: the 135M model sometimes rambles inside one
    # until max_tokens. Every output that ended by itself is an object, and some do end.
    finished = 0
    for seed in range(4):
        reply = create(
            client,
            messages=[{"role": "user", "content": "Reply with a JSON object."}],
            response_format={"type": "json_object"},
            temperature=0.7,
            seed=seed,
            max_tokens=200,
        )
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            finished += 1
    assert finished >= 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
         "response_format"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "string",
                                                                      "pattern": "(["}}}},
         "response_format"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, None),
        ({"response_format": {"type": "yaml"}}, None),
    ],
)
def test_bad_tool_and_format_requests_are_400(server, body, param):
    reply = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": ASK, "max_tokens": 4, **body},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    server.assert_pool_whole()


def test_grammar_state_is_freed_when_a_stream_is_dropped(server, client):
    stream = create(client, messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
                    max_tokens=200)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    server.assert_pool_whole()
    grammars = server.engine.grammars
    assert grammars is not None and len(grammars) == 0
