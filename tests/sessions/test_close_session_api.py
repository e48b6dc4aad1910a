"""DELETE /v1/sessions/{id} over HTTP: the engine in a thread and in its own process (a
model-free engine: the fakes' character tokenizer)."""

from __future__ import annotations

import functools
import time

import httpx
import pytest

from heddle.engine.core_client import CoreClient
from tests.server.fakes import make_engine
from tests.server.live import LiveServer

KEY = "k-sessions"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _turn(server, session_id, close=False):
    body = {"messages": [{"role": "user", "content": "run the tests of the parser " * 4}],
            "max_tokens": 3, "temperature": 0, "session_id": session_id,
            "close_session": close}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH,
                          timeout=30)
    assert response.status_code == 200, response.text


def _delete(server, session_id, headers=AUTH):
    return httpx.delete(f"{server.base_url}/v1/sessions/{session_id}", headers=headers,
                        timeout=30)


def _until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _check_not_found(response, session_id):
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "session_id" and error["code"] == "session_not_found"
    assert session_id in error["message"]


def test_delete_closes_a_parked_session_in_a_threaded_engine():
    engine = make_engine(num_blocks=256, retention="cost")
    server = LiveServer(engine, api_key=KEY).start()
    try:
        _turn(server, "agent-7")
        assert "agent-7" in engine.scheduler.sessions.parked
        assert _delete(server, "agent-7", headers={}).status_code == 401  # same auth as /v1
        assert "agent-7" in engine.scheduler.sessions.parked
        response = _delete(server, "agent-7")
        assert response.status_code == 200, response.text
        assert response.json() == {"id": "agent-7", "object": "session", "deleted": True}
        _until(lambda: engine.kv_cache.num_used_blocks == 0)
        assert not engine.scheduler.sessions.parked
        _check_not_found(_delete(server, "agent-7"), "agent-7")  # closed already
        _check_not_found(_delete(server, "never-seen"), "never-seen")
        _turn(server, "agent-8", close=True)  # closed by its last turn: unknown after it
        _check_not_found(_delete(server, "agent-8"), "agent-8")
        engine_check = engine.check_integrity
        server.wait_idle()
        engine_check()
    finally:
        server.stop()


@pytest.mark.slow
def test_delete_closes_a_parked_session_in_an_engine_core_process():
    client = CoreClient(functools.partial(make_engine, num_blocks=256, retention="cost"))
    client.start()
    server = LiveServer(client=client, api_key=KEY).start()
    try:
        _turn(server, "agent-9")
        _until(lambda: client.stats.kv_blocks_used > 0)  # its context is parked
        response = _delete(server, "agent-9")
        assert response.status_code == 200, response.text
        _until(lambda: client.stats.kv_blocks_used == 0)
        _check_not_found(_delete(server, "agent-9"), "agent-9")
    finally:
        server.stop()
        client.shutdown()


def test_closing_a_session_with_a_turn_in_flight_parks_nothing_when_it_ends():
    from heddle.request import SamplingParams

    engine = make_engine(num_blocks=64, retention="cost")
    params = SamplingParams(max_tokens=2, temperature=0.0)
    engine.add_request("t0", list(range(100, 120)), params, session_id="s")
    engine.step()  # running
    assert engine.close_session("s") is True
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.scheduler.sessions.parked and engine.kv_cache.num_used_blocks == 0
    assert engine.close_session("s") is False  # nothing held any more
    engine.check_integrity()
