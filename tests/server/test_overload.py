"""A bounded waiting queue: under a burst every request completes or gets a 429 at once."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.server.live import LiveServer, real_engine

pytestmark = pytest.mark.slow

NUM_REQUESTS = 20
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server():
    live = LiveServer(real_engine(max_num_seqs=2, max_waiting=2)).start()
    yield live
    live.stop()


async def _one(client: httpx.AsyncClient, index: int, stream: bool) -> tuple[int, float, dict]:
    body = {
        "prompt": f"Request number {index} says",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }
    start = time.perf_counter()
    if not stream:
        response = await client.post("/v1/completions", json=body)
        return response.status_code, time.perf_counter() - start, response.json()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            data = json.loads(await response.aread())
            return response.status_code, time.perf_counter() - start, data
        texts, finish = [], None
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                texts.append(choice["text"])
                finish = choice["finish_reason"] or finish
        return 200, time.perf_counter() - start, {"finish_reason": finish}


async def _burst(base_url: str) -> list[tuple[int, float, dict]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        jobs = [_one(client, i, stream=i % 2 == 0) for i in range(NUM_REQUESTS)]
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=90)


def test_burst_completes_or_gets_429_and_the_pool_stays_whole(server):
    results = asyncio.run(_burst(server.base_url))
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1, statuses
    completed_times = [t for status, t, _ in results if status == 200]
    for status, elapsed, body in results:
        if status == 429:
            error = body["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
            # Refused at once: well before the requests that ran could finish.
            assert elapsed < max(completed_times)
        elif "usage" in body:
            assert body["usage"]["completion_tokens"] == MAX_TOKENS
        else:
            assert body["finish_reason"] == "length"
    server.assert_pool_whole()
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert f'heddle_http_errors_total{{status="429"}} {statuses.count(429)}.0' in metrics


def test_the_server_serves_normally_after_the_burst(server):
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": "After the storm", "max_tokens": 3, "ignore_eos": True},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
    server.assert_pool_whole()
