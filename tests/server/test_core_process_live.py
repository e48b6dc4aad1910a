"""The server over an engine core in its own process (what `heddle serve` runs), real model.

The core loads the embedded model in a child process (about 5 s on 2 cores, twice here: the
kill test makes the server start a second core).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time

import httpx
import openai
import pytest

from heddle.engine.core_client import CoreClient
from heddle.engine.core_process import engine_from_config
from heddle.engine.llm import LLM
from heddle.request import SamplingParams
from tests.server.live import LiveServer, core_config, real_engine, shared_executor

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server():
    shared_executor()  # skips the module when the embedded model is not installed
    client = CoreClient(functools.partial(engine_from_config, core_config(max_num_seqs=16)))
    client.start()
    live = LiveServer(client=client).start()
    yield live
    live.stop()
    client.shutdown()


@pytest.fixture(scope="module")
def openai_client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_outputs_match_the_in_process_engine(server, openai_client):
    llm = LLM.from_engine(real_engine())
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=True)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    reference = llm.generate([ids], params)[0].outputs[0]
    model = openai_client.models.list().data[0].id
    assert model == "SmolLM2-135M-Instruct"
    whole = openai_client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert whole.choices[0].text == reference.text
    assert whole.usage.completion_tokens == 12
    assert whole.choices[0].logprobs.token_logprobs == pytest.approx(
        [lp.logprob for lp in reference.logprobs], abs=1e-3
    )
    streamed = openai_client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == reference.text
    # A stop string from the middle of that text: found on the front end, held back, ended.
    stop = reference.text.strip()[2:5]
    stopped = openai_client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == reference.text[: reference.text.index(stop)]
    chunks = openai_client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == stopped.choices[0].text
    server.assert_pool_whole()


def test_chat_with_n_streams_every_choice(server, openai_client):
    kwargs = dict(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=5, n=3, seed=7)
    # Once first, so that every run below finds the prompt in the prefix cache (a cold prefill
    # and a cached one differ in the last bits of bf16, and so can sample differently).
    openai_client.chat.completions.create(model=kwargs["model"], messages=CHAT, max_tokens=1)
    whole = openai_client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert whole.usage.completion_tokens == 15
    again = openai_client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in whole.choices]
    texts: dict[int, str] = {}
    finished: list[int] = []
    for chunk in openai_client.chat.completions.create(
        **kwargs, stream=True, extra_body={"ignore_eos": True}
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished.append(choice.index)
    assert sorted(texts) == [0, 1, 2] and all(texts.values())
    assert sorted(finished) == [0, 1, 2]
    server.assert_pool_whole()


async def _disconnect_storm(base_url: str, count: int) -> None:
    body = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:

        async def one() -> None:
            async with http.stream("POST", "/v1/completions", json=body) as response:
                lines = 0
                async for line in response.aiter_lines():
                    lines += bool(line)
                    if lines >= 3:
                        return  # leave mid-stream: the connection closes

        await asyncio.gather(*(one() for _ in range(count)))


def test_a_disconnect_storm_returns_every_block(server):
    server.wait_idle()
    asyncio.run(asyncio.wait_for(_disconnect_storm(server.base_url, 12), 120))
    server.assert_pool_whole()
    steps = server.async_engine.stats.num_steps
    time.sleep(0.2)
    assert server.async_engine.stats.num_steps == steps  # nothing left running


async def _load_then_kill(server: LiveServer) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}
    results: dict = {"streams": [], "whole": []}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        started = asyncio.Event()

        async def stream() -> None:
            lines = []
            async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
                        started.set()
            results["streams"].append(lines)

        async def whole() -> None:
            response = await http.post("/v1/completions", json=body)
            results["whole"].append((response.status_code, response.json()))

        tasks = [asyncio.create_task(stream()) for _ in range(6)]
        tasks += [asyncio.create_task(whole()) for _ in range(2)]
        await asyncio.wait_for(started.wait(), 60)
        deadline = time.monotonic() + 30
        while server.async_engine.stats.num_running < 8:
            assert time.monotonic() < deadline, server.async_engine.stats
            await asyncio.sleep(0.02)
        os.kill(server.async_engine.core_pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        health = await http.get("/health")
        results["health_after_kill"] = (health.status_code, health.json())
        late = await http.post("/v1/completions", json={**body, "max_tokens": 2})
        results["late_status"] = late.status_code
    return results


def test_killing_the_core_under_load_fails_every_request_then_serves_again(server):
    server.wait_idle()
    results = asyncio.run(_load_then_kill(server))
    assert len(results["streams"]) == 6 and len(results["whole"]) == 2
    for lines in results["streams"]:
        # Some tokens, then an error event, then [DONE]: nothing hangs, nothing ends silently.
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert error["code"] == "engine_unavailable" and "exited" in error["message"]
    for status, body in results["whole"]:
        assert status == 503 and body["error"]["code"] == "engine_unavailable"
    status, health = results["health_after_kill"]
    assert status == 503 and "restarting" in health["error"]["message"]
    assert results["late_status"] == 503
    # A new core loads the model; then the server serves as before, from a whole KV pool.
    deadline = time.monotonic() + 120
    while httpx.get(f"{server.base_url}/health").status_code != 200:
        assert time.monotonic() < deadline, "the core did not come back"
        time.sleep(0.2)
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True},
        timeout=60,
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    server.assert_pool_whole()
    assert server.async_engine.num_restarts == 1


def test_metrics_come_from_the_core(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    values = {
        line.split()[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["heddle_kv_blocks_used"] == 0
    assert values["heddle_kv_blocks_free"] == 256
    assert values["heddle_steps_total"] > 0
    assert values["heddle_e2e_request_latency_seconds_count"] >= 5
    assert values['heddle_requests_finished_total{finish_reason="abort"}'] >= 12


def test_grammars_apply_in_the_core_process(server, openai_client):
    # The core has no tokenizer of its own (the front end detokenizes): it still compiles the
    # grammar with the executor's, masks, and rejects a bad schema with a 400.
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"]}}}  # fmt: skip
    reply = openai_client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool], tool_choice="required", parallel_tool_calls=False, temperature=0,
        max_tokens=60,
    )  # fmt: skip
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert reply.choices[0].finish_reason == "tool_calls"
    bad = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "messages": CHAT, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
