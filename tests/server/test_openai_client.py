"""The official openai client against a live heddle server with the real embedded model."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.server.live import API_KEY, LiveServer, real_engine

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three colors."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    live = LiveServer(real_engine(max_num_seqs=16), api_key=API_KEY).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_models_and_health(server, client, model):
    assert model == "SmolLM2-135M-Instruct"
    health = httpx.get(f"{server.base_url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_chat_non_streaming_counts_tokens(server, client, model):
    tokenizer = server.engine.tokenizer
    reply = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT))
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == len(prompt_ids) + 6


def test_chat_streaming_matches_non_streaming(client, model):
    kwargs = dict(model=model, messages=CHAT, max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completions_text_and_token_prompts_agree(server, client, model):
    ids = server.engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids)
    assert by_text.usage.completion_tokens == by_ids.usage.completion_tokens <= 5


def test_completions_streaming_with_usage(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_ends_the_text_before_it(client, model):
    free = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    text = free.choices[0].text
    stop = text.strip()[2:5]  # a piece from the middle of what the model says
    assert stop and stop in text
    stopped = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]
    streamed = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text


def test_n_completions_with_seed(server, client, model):
    kwargs = dict(model=model, messages=CHAT, max_tokens=5, n=3, temperature=1.0, seed=7)
    first = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert first.usage.completion_tokens == 15
    again = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in first.choices]
    streamed = client.chat.completions.create(**kwargs, stream=True)
    indices = {c.choices[0].index for c in streamed if c.choices}
    assert indices == {0, 1, 2}
    server.assert_pool_whole()


def test_logprobs_in_both_formats(client, model):
    completion = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert (
        len(logprobs.tokens) == len(logprobs.token_logprobs) == completion.usage.completion_tokens
    )
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == completion.choices[0].text
    chat = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0.0 and len(token.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob, abs=1e-4)


def test_api_key_is_required(server, model):
    url = f"{server.base_url}/v1/completions"
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(url, json=body, headers=headers)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # not behind the key


def test_disconnect_mid_stream_returns_every_block(server, model):
    server.wait_idle()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with (
        httpx.Client(base_url=server.base_url, headers=headers) as http,
        http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response,
    ):
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received and received[0].startswith("data: ")
        assert server.async_engine.stats.kv_blocks_used > 0
    # Leaving the block closed the connection mid-stream.
    server.assert_pool_whole()
    records_before = server.engine.num_steps
    time.sleep(0.2)
    assert server.engine.num_steps == records_before  # nothing left running


def test_disconnect_while_waiting_for_a_whole_response(server, model):
    server.wait_idle()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=0.5)
    server.assert_pool_whole()


def test_metrics_after_traffic(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in (
        "heddle_num_requests_running",
        "heddle_num_requests_waiting",
        "heddle_num_requests_preempted",
        "heddle_kv_blocks_used",
        "heddle_kv_blocks_free",
        "heddle_prefix_cache_hit_rate",
        "heddle_time_to_first_token_seconds_bucket",
        "heddle_time_per_output_token_seconds_bucket",
        "heddle_e2e_request_latency_seconds_bucket",
        "heddle_request_queue_time_seconds_bucket",
        "heddle_step_duration_seconds_bucket",
        "heddle_step_batch_size_bucket",
    ):
        assert name in text, name
    count = next(
        line
        for line in text.splitlines()
        if line.startswith("heddle_e2e_request_latency_seconds_count")
    )
    assert float(count.split()[-1]) >= 10
    assert 'heddle_requests_finished_total{finish_reason="abort"}' in text


def test_a_batch_of_prompts(client, model):
    prompts = ["One, two,", "Red, green,"]
    kwargs = dict(model=model, prompt=prompts, max_tokens=3, n=2, temperature=0)
    batch = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage.completion_tokens == 12
    single = client.completions.create(
        model=model, prompt=prompts[1], max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert batch.choices[2].text == single.choices[0].text
    texts = {}
    for chunk in client.completions.create(**kwargs, stream=True, extra_body={"ignore_eos": True}):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert sorted(texts) == [0, 1, 2, 3] and texts[2] == single.choices[0].text
