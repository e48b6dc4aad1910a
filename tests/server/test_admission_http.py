"""Admission control through the server: a request that cannot meet its TTFT target gets a 429
with Retry-After at once, /metrics counts it by class and reason, and nothing else is hurt.

The engine core runs in its own process (the model-free engine of tests/server/fakes.py), so
the refusal crosses the same wire as in `heddle serve`.
"""

from __future__ import annotations

import functools
import json
import time

import httpx
import pytest

from heddle.engine.core_client import CoreClient
from tests.server.fakes import make_engine
from tests.server.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    factory = functools.partial(
        make_engine,
        step_time=0.01,
        max_num_seqs=1,
        admission="slo",
        admission_options={"ttft_slo": 0.3, "min_observed_seconds": 0.0},
    )
    client = CoreClient(factory)
    client.start()
    live = LiveServer(client=client).start()
    yield live
    live.stop()
    client.shutdown()


def test_a_request_that_cannot_be_served_in_time_gets_429_with_retry_after(server):
    body = {"prompt": "hold the only seat", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as held,
    ):
        lines = held.iter_lines()
        # The seat is taken and tokens flow; after 60 steps (0.6 s) without a departure
        # (the core's warm-up request was the last one) a seat is predicted to take longer
        # than the TTFT target allows.
        first = [next(lines) for _ in range(120)]  # data lines and the blanks between
        assert all(line.startswith("data: {") for line in first[::2])
        start = time.perf_counter()
        refused = client.post(
            "/v1/completions",
            json={"prompt": "me too", "max_tokens": 4, "request_class": "chat"},
        )
        elapsed = time.perf_counter() - start
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert "predicted time to first token" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert elapsed < 1.0  # refused at arrival, not after queueing
        # The held request is unharmed.
        texts = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert len(texts) == 200 - 60 and "usage" not in texts[-1]
        assert texts[-1]["choices"][0]["finish_reason"] == "length"
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert 'heddle_requests_refused_total{reason="seats",request_class="chat"} 1.0' in metrics
    assert 'heddle_http_errors_total{status="429"} 1.0' in metrics
    server.assert_pool_whole()


def test_an_idle_server_admits(server):
    response = httpx.post(
        f"{server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
