"""/dashboard on a live app: the same API-key rules as /v1, the store fed by the engine's
steps (in a thread of the server, or in an engine core process of its own), and the stream.
The model-free engine of tests/server/fakes.py runs the steps."""

from __future__ import annotations

import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from heddle.engine.async_engine import AsyncEngine
from heddle.engine.core_client import CoreClient
from heddle.server.app import build_app
from heddle.view import routes
from heddle.view.live import view_source
from tests.server.fakes import CharTokenizer, make_engine

KEY = "sekret"


def app(**kwargs: object):  # -> FastAPI
    engine = make_engine(step_time=0.001, max_num_seqs=4)
    return build_app(AsyncEngine(engine), tokenizer=CharTokenizer(), **kwargs)  # type: ignore[arg-type]


def core_app():  # -> FastAPI
    """As `heddle serve` runs: the engine in a core process, the view's rows over its channel."""
    factory = functools.partial(make_engine, step_time=0.003, max_num_seqs=2, num_blocks=96)
    client = CoreClient(factory, event_source=view_source)
    client.start()  # spawns the core and waits for it (the app's start attaches it)
    return build_app(client)


def eventually(read, key: str, value: object, timeout: float = 5.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        data = read()
        if data[key] == value or time.monotonic() > deadline:
            return data
        time.sleep(0.01)


def complete(
    client: TestClient, prompt: str, headers: dict[str, str] | None = None, max_tokens: int = 6
) -> None:
    response = client.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        headers=headers or {},
    )
    assert response.status_code == 200, response.text


def test_dashboard_follows_the_engine_step_by_step() -> None:
    with TestClient(app()) as client:
        for i in range(3):
            complete(client, f"hello {i}")
        # Records reach the store right after the step that finished them: wait for them.
        meta = eventually(lambda: client.get("/dashboard/api/meta").json(), "num_requests", 3)
        assert meta["mode"] == "live"
        engine_steps = client.get("/health").json()["engine"]["num_steps"]
        assert meta["num_steps"] == engine_steps > 0
        assert meta["num_requests"] == 3
        steps = client.get("/dashboard/api/steps").json()
        assert sum(steps["n"]) == engine_steps
        assert sum(sum(col) for col in steps["decode"].values()) > 0
        latency = client.get("/dashboard/api/latency").json()
        assert latency["classes"]["all"]["completed"] == 3
        first = client.get("/dashboard/api/requests?sort=arrival").json()[0]["id"]
        detail = client.get(f"/dashboard/api/request/{first}").json()
        assert detail["segments"][-1]["kind"] == "decode"


def test_dashboard_of_an_engine_core_in_its_own_process_is_live() -> None:
    with TestClient(core_app()) as client:
        prompts = [f"hello {i}, a prompt" for i in range(4)]
        with ThreadPoolExecutor(4) as pool:  # four at once for two seats: two of them wait
            list(pool.map(functools.partial(complete, client, max_tokens=60), prompts))
        meta = eventually(lambda: client.get("/dashboard/api/meta").json(), "num_requests", 4)
        engine = client.get("/health").json()["engine"]
        meta = eventually(
            lambda: client.get("/dashboard/api/meta").json(), "num_steps", engine["num_steps"]
        )
        assert meta["num_steps"] == engine["num_steps"] > 0  # the warm-up's steps are not shown
        assert meta["info"]["num_blocks"] == 96 and meta["kv_total"] == 96
        steps = client.get("/dashboard/api/steps").json()
        assert sum(steps["n"]) == engine["num_steps"]
        assert sum(sum(col) for col in steps["prefill"].values()) > 0
        # Times are on the view's clock: from its start, not the core's monotonic origin.
        assert 0 <= steps["t"][0] < 60
        rows = client.get("/dashboard/api/requests?sort=arrival").json()
        assert sorted(r["prompt"] for r in rows) == sorted(len(p) for p in prompts)
        assert all(0 <= r["arrival"] < 60 for r in rows)
        # Decision events crossed too: the requests that waited for a seat say so.
        waited = [r for r in rows if r["stall"] > 0]
        assert waited
        for row in waited:
            detail = client.get(f"/dashboard/api/request/{row['id']}").json()
            assert detail["segments"][-1]["kind"] == "decode"
            assert sum(detail["reasons"].values()) == pytest.approx(row["stall"], abs=1e-5)
            assert "no_seat" in detail["reasons"] or "token_budget" in detail["reasons"]


def test_the_stream_sends_new_steps_and_resumes_from_its_last_id(monkeypatch) -> None:
    monkeypatch.setattr(routes, "STREAM_LIFETIME_S", 0.3)  # one short stream, then it ends
    with TestClient(app()) as client:
        complete(client, "stream me")
        total = client.get("/dashboard/api/meta").json()["num_steps"]
        with client.stream("GET", "/dashboard/api/stream?steps=1&events=0") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            body = "".join(response.iter_text())
        data = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
        ids = [line[4:] for line in body.splitlines() if line.startswith("id: ")]
        assert len(data[0]["rows"]) == total - 1  # every step after the first one
        assert data[0]["num_steps"] == total and ids[0] == f"{total}:0"
        assert data[0]["walls"][-1] > 0
        # A browser reconnecting sends the id it last saw: nothing is sent twice.
        with client.stream(
            "GET", "/dashboard/api/stream", headers={"last-event-id": ids[0]}
        ) as response:
            again = "".join(response.iter_text())
        assert "data: " not in again


def test_dashboard_needs_the_api_key_like_v1() -> None:
    with TestClient(app(api_key=KEY), follow_redirects=False) as client:
        denied = client.get("/dashboard")
        assert denied.status_code == 401
        assert "api_key=KEY" in denied.json()["error"]["message"]
        assert client.get("/dashboard/api/meta").status_code == 401
        assert client.get("/dashboard?api_key=wrong").status_code == 401
        assert client.get("/v1/models?api_key=" + KEY).status_code == 401  # not for the API
        headers = {"Authorization": f"Bearer {KEY}"}
        assert client.get("/dashboard/api/meta", headers=headers).status_code == 200
        # A browser opens /dashboard?api_key=KEY: the key moves into an HttpOnly cookie.
        moved = client.get(f"/dashboard?api_key={KEY}")
        assert moved.status_code == 303 and moved.headers["location"] == "/dashboard"
        assert "HttpOnly" in moved.headers["set-cookie"]
        assert client.get("/dashboard").status_code == 200  # the client kept the cookie
        assert client.get("/dashboard/api/meta").status_code == 200
        assert client.get("/health").status_code == 200  # unprotected, as before
