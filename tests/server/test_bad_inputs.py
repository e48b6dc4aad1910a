"""Bad requests get a 4xx with an OpenAI-style error body, and hurt no request in flight."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.server.live import MAX_MODEL_LEN, LiveServer, real_engine

pytestmark = pytest.mark.slow

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
LONG_PROMPT = [300] * (MAX_MODEL_LEN + 10)

# (name, path, body: dict | raw bytes, status, param)
CASES = [
    ("malformed json", COMPLETIONS, b'{"prompt": "hi", ', 400, None),
    ("not an object", COMPLETIONS, b"[1, 2, 3]", 400, None),
    ("no prompt", COMPLETIONS, {"max_tokens": 2}, 400, "prompt"),
    ("prompt of wrong type", COMPLETIONS, {"prompt": 5}, 400, "prompt"),
    (
        "max_tokens not a number",
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": "x"},
        400,
        "max_tokens",
    ),
    ("max_tokens zero", COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("temperature negative", COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("top_p zero", COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("stop of wrong type", COMPLETIONS, {"prompt": "hi", "stop": 3}, 400, "stop"),
    ("empty stop string", COMPLETIONS, {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("unknown model", COMPLETIONS, {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    ("empty prompt", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    ("empty token list", COMPLETIONS, {"prompt": []}, 400, "prompt"),
    ("token id outside the vocab", COMPLETIONS, {"prompt": [10**7]}, 400, "prompt"),
    ("prompt longer than the context", COMPLETIONS, {"prompt": LONG_PROMPT}, 400, "prompt"),
    (
        "max_tokens beyond the context",
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": MAX_MODEL_LEN},
        400,
        "max_tokens",
    ),
    ("n over the limit", COMPLETIONS, {"prompt": "hi", "n": 17}, 400, "n"),
    ("logprobs over the limit", COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("echo unsupported", COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo"),
    ("penalty unsupported", COMPLETIONS, {"prompt": "hi", "presence_penalty": 1}, 400, None),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("no messages", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, None),
    (
        "image content",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages.0.content",
    ),
    (
        "top_logprobs over the limit",
        CHAT,
        {"messages": USER, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    ("top_logprobs without logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400, None),
    (
        "unknown response format",
        CHAT,
        {"messages": USER, "response_format": {"type": "yaml"}},
        400,
        "response_format.type",
    ),
    (
        "max_completion_tokens zero",
        CHAT,
        {"messages": USER, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),
]


@pytest.fixture(scope="module")
def server():
    live = LiveServer(real_engine(max_num_seqs=8), max_body_bytes=4 * 1024 * 1024).start()
    yield live
    live.stop()


def _post(base_url: str, path: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{base_url}{path}", content=content, headers=headers, timeout=30)


def _assert_error_body(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "param"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_gets_an_openai_error(server, name, path, body, status, param):
    _assert_error_body(_post(server.base_url, path, body), status, param)


def test_oversized_body_is_refused(server):
    big = {"prompt": "x" * (5 * 1024 * 1024)}
    _assert_error_body(_post(server.base_url, COMPLETIONS, big), 413, None)

    # A body sent in chunks, without Content-Length, is measured as it arrives.
    def chunks():
        yield b'{"prompt": "'
        for _ in range(5):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    response = httpx.post(f"{server.base_url}{COMPLETIONS}", content=chunks(), timeout=30)
    _assert_error_body(response, 413, None)


def test_unknown_route_and_method(server):
    _assert_error_body(httpx.get(f"{server.base_url}/v1/nothing"), 404, None)
    _assert_error_body(httpx.get(f"{server.base_url}{COMPLETIONS}"), 405, None)


def test_bad_requests_leave_a_stream_in_flight_untouched(server):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "stream": True}
    body["temperature"] = 0
    chunks: list[dict] = []

    def stream() -> None:
        with httpx.stream("POST", f"{server.base_url}{COMPLETIONS}", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))

    thread = threading.Thread(target=stream)
    thread.start()
    for _, path, bad, status, _ in CASES:
        assert _post(server.base_url, path, bad).status_code == status
    thread.join(60)
    assert not thread.is_alive()
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    reference = _post(server.base_url, COMPLETIONS, {**body, "stream": False}).json()
    assert "".join(c["choices"][0]["text"] for c in chunks) == reference["choices"][0]["text"]
    assert reference["usage"]["completion_tokens"] == 24
    server.assert_pool_whole()
