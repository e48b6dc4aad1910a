"""Schema validity of structured outputs on the embedded model: 24 schemas x 3 seeds, as
response_format json_schema and as forced tool calls (named; required among 3 tools, one call
or parallel calls).

    /work/tools/cpu /work/tools/py benchmarks/structured_suite.py [--seeds 3] [--concurrency 16]

Serves the embedded SmolLM2-135M-Instruct with `heddle serve`'s app on 127.0.0.1 (uvicorn in a
thread) and sends every case through the official openai client, at temperature 0.8 with the
seed. An output counts as valid when it finished by itself (not cut by max_tokens), parses as
JSON, and validates under the schema (jsonschema, formats checked); for tool calls, every call
names one of the offered tools and its arguments validate under that tool's parameters.
Prints one line per schema and the totals; writes JSON under results/. Exits 1 if any case
is invalid. tests/server/test_structured_suite.py runs a subset in CI.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema

NAME = {"type": "string", "maxLength": 16}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer"}},
               "required": ["name", "age"]},
    "enum_color": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                   "required": ["color"]},
    "bounded_int": {"type": "object",
                    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                    "required": ["score"]},
    "number_range": {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 1000}}, "required": ["price"]},
    "booleans": {"type": "object", "properties": {"done": {"type": "boolean"},
                                                 "starred": {"type": "boolean"}},
                 "required": ["done", "starred"]},
    "string_array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 4}},
        "required": ["tags"]},
    "int_array": {"type": "object", "properties": {
        "values": {"type": "array", "items": {"type": "integer"}, "maxItems": 5}},
        "required": ["values"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": NAME, "email": NAME},
                 "required": ["name", "email"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]},
    "deep_nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}},
        "required": ["b"]}}, "required": ["a"]},
    "array_of_objects": {"type": "object", "properties": {"items": {
        "type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "sku": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["sku", "qty"]}}}, "required": ["items"]},
    "optional_fields": {"type": "object", "properties": {"title": NAME, "subtitle": NAME,
                                                         "year": {"type": "integer"}},
                        "required": ["title"]},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"],
                                                           "maxLength": 16}},
                 "required": ["note"]},
    "any_of": {"type": "object", "properties": {"id": {"anyOf": [
        {"type": "integer"}, {"type": "string", "maxLength": 8}]}}, "required": ["id"]},
    "const": {"type": "object", "properties": {"version": {"const": 2}, "name": NAME},
              "required": ["version", "name"]},
    "refs": {"type": "object", "$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"]},
    "pattern": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}, "required": ["code"]},
    "date_format": {"type": "object", "properties": {"day": {"type": "string",
                                                            "format": "date"}},
                    "required": ["day"]},
    "no_extra": {"type": "object", "properties": {"k": NAME}, "required": ["k"],
                 "additionalProperties": False},
    "enum_array": {"type": "object", "properties": {"days": {
        "type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "minItems": 1,
        "maxItems": 3}}, "required": ["days"]},
    "mixed_enum": {"type": "object", "properties": {"level": {"enum": [1, 2, "high", None]}},
                   "required": ["level"]},
    "order": {"type": "object", "properties": {
        "customer": NAME, "lines": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"item": NAME, "count": {"type": "integer",
                                                                    "minimum": 1,
                                                                    "maximum": 9}},
            "required": ["item", "count"]}},
        "priority": {"enum": ["low", "high"]}}, "required": ["customer", "lines", "priority"]},
    "string_lengths": {"type": "object", "properties": {"word": {
        "type": "string", "minLength": 3, "maxLength": 6}}, "required": ["word"]},
    "tuple": {"type": "object", "properties": {"pair": {
        "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string",
                                                               "maxLength": 8}],
        "items": False}}, "required": ["pair"]},
    "weather_call": {"type": "object", "properties": {
        "city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"]},
}
EXTRA_TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {
                                          "query": NAME}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "integer"}},
                                          "required": ["a", "b"]}}},
]
# The target modes: a json_schema response, a named tool, a required call (one call:
# parallel_tool_calls=false). "required_parallel" (parallel calls allowed, OpenAI's default) is
# reported beside them: there the 135M model may repeat its call until max_tokens cuts it.
TARGET_MODES = ("json_schema", "named_tool", "required_tool")
MODES = (*TARGET_MODES, "required_parallel")


@dataclass
class Case:
    schema: str
    mode: str
    seed: int
    valid: bool
    reason: str
    tokens: int
    text: str


def tool_for(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"Record a {name}.",
                                             "parameters": SCHEMAS[name]}}


def validate(instance: Any, schema: dict[str, Any]) -> None:
    jsonschema.validate(instance, schema, format_checker=jsonschema.FormatChecker())


def run_case(client: Any, model: str, name: str, mode: str, seed: int, max_tokens: int) -> Case:
    schema = SCHEMAS[name]
    messages = [{"role": "user", "content": f"Give me an example {name.replace('_', ' ')}."}]
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                              "temperature": 0.8, "seed": seed}
    tools = {t["function"]["name"]: t["function"]["parameters"]
             for t in [tool_for(name), *EXTRA_TOOLS]}
    if mode == "json_schema":
        kwargs["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": name, "schema": schema}}
    elif mode == "named_tool":
        kwargs["tools"] = [tool_for(name), *EXTRA_TOOLS]
        kwargs["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        kwargs["tools"] = [tool_for(name), *EXTRA_TOOLS]
        kwargs["tool_choice"] = "required"
        kwargs["parallel_tool_calls"] = mode == "required_parallel"
    reply = client.chat.completions.create(**kwargs)
    choice = reply.choices[0]
    tokens = reply.usage.completion_tokens
    try:
        if mode == "json_schema":
            text = choice.message.content or ""
            if choice.finish_reason != "stop":
                raise ValueError(f"finish_reason {choice.finish_reason}")
            validate(json.loads(text), schema)
        else:
            calls = choice.message.tool_calls or []
            text = json.dumps([[c.function.name, c.function.arguments] for c in calls])
            if choice.finish_reason != "tool_calls" or not calls:
                raise ValueError(f"finish_reason {choice.finish_reason}, {len(calls)} calls")
            if mode == "named_tool" and [c.function.name for c in calls] != [name]:
                raise ValueError(f"called {[c.function.name for c in calls]}")
            for call in calls:
                validate(json.loads(call.function.arguments), tools[call.function.name])
    except (ValueError, jsonschema.ValidationError) as e:
        return Case(name, mode, seed, False, str(e).splitlines()[0][:200], tokens, text)
    return Case(name, mode, seed, True, "", tokens, text)


def run_suite(client: Any, model: str, names: list[str], modes: list[str], seeds: list[int],
              max_tokens: int = 200, concurrency: int = 16) -> list[Case]:
    jobs = [(n, m, s) for n in names for m in modes for s in seeds]
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: run_case(client, model, *job, max_tokens), jobs))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--schemas", nargs="*", default=sorted(SCHEMAS))
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--output", default="results/structured_suite.json")
    args = parser.parse_args()

    import openai
    import uvicorn

    from heddle.config import EngineConfig, ModelConfig, SchedulerConfig
    from heddle.engine.async_engine import AsyncEngine
    from heddle.engine.engine import Engine
    from heddle.server.app import build_app

    config = EngineConfig(model=ModelConfig(num_threads=2),
                          scheduler=SchedulerConfig(max_num_seqs=args.concurrency))
    app = build_app(AsyncEngine(Engine.from_config(config)))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        start = time.perf_counter()
        cases = run_suite(client, model, args.schemas, args.modes, list(range(args.seeds)),
                          args.max_tokens, args.concurrency)
        elapsed = time.perf_counter() - start
    finally:
        server.should_exit = True
        thread.join(30)
    by_schema: dict[str, list[Case]] = {}
    for case in cases:
        by_schema.setdefault(case.schema, []).append(case)
    for name, group in by_schema.items():
        bad = [c for c in group if not c.valid]
        line = f"{name:18s} {len(group) - len(bad):3d}/{len(group)} valid"
        if bad:
            line += "  " + "; ".join(f"{c.mode} seed {c.seed}: {c.reason}" for c in bad[:2])
        print(line)
    for mode in args.modes:
        group = [c for c in cases if c.mode == mode]
        print(f"{mode:18s} {sum(c.valid for c in group)}/{len(group)} valid, "
              f"mean {sum(c.tokens for c in group) / len(group):.0f} tokens")
    target = [c for c in cases if c.mode in TARGET_MODES]
    num_valid = sum(c.valid for c in target)
    print(f"target modes: {num_valid}/{len(target)} valid "
          f"({100 * num_valid / max(1, len(target)):.1f}%) over {len(by_schema)} schemas x "
          f"{args.seeds} seeds; all modes in {elapsed:.0f} s")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(c) for c in cases], indent=1) + "\n")
    return 0 if num_valid == len(target) else 1


if __name__ == "__main__":
    sys.exit(main())
