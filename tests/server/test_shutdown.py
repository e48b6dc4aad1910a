"""SIGTERM: stop accepting, let short requests finish, cut long ones at the timeout, return 0.

`run_server` runs in the test's main thread (where uvicorn listens for signals), over the shared
model in a thread or with its own engine core process, and a helper thread sends SIGTERM to this
process once two streams are under way.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from heddle.server.app import run_server
from tests.server.live import core_config, free_port, real_engine, shared_executor

pytestmark = pytest.mark.slow


def _stream(base_url: str, max_tokens: int, started: threading.Event, out: dict) -> None:
    body = {"prompt": "Tell me a story", "max_tokens": max_tokens, "ignore_eos": True}
    try:
        with httpx.stream(
            "POST", f"{base_url}/v1/completions", json={**body, "stream": True}, timeout=60
        ) as response:
            for line in response.iter_lines():
                started.set()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    out["finish_reason"] = choice["finish_reason"] or out.get("finish_reason")
    except httpx.HTTPError as e:
        out["error"] = repr(e)
    finally:
        started.set()


def _client_side(base_url: str, results: dict) -> None:
    """Wait for the server, start a short and a long stream, SIGTERM, then probe."""
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.05)
        events = [threading.Event(), threading.Event()]
        streams = [
            threading.Thread(target=_stream, args=(base_url, 4, events[0], results["short"])),
            threading.Thread(target=_stream, args=(base_url, 400, events[1], results["long"])),
        ]
        for thread in streams:
            thread.start()
        for event in events:
            assert event.wait(60)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        try:
            httpx.get(f"{base_url}/health", timeout=2)
            results["accepted_after_sigterm"] = True
        except httpx.ConnectError:
            results["accepted_after_sigterm"] = False
        for thread in streams:
            thread.join(30)
            results["hung"] = results.get("hung", False) or thread.is_alive()
    except BaseException as e:  # reported by the test in the main thread
        results["error"] = repr(e)
        os.kill(os.getpid(), signal.SIGTERM)  # stop the server so the test can fail


@pytest.mark.parametrize("engine_core", ["thread", "process"])
def test_sigterm_drains_in_flight_requests_and_returns_zero(capfd, engine_core):
    port = free_port()
    results: dict = {"short": {}, "long": {}}
    client = threading.Thread(target=_client_side, args=(f"http://127.0.0.1:{port}", results))
    client.start()
    if engine_core == "thread":
        engine = {"engine": real_engine(max_num_seqs=4)}
        timeout = 1.0
    else:  # what `heddle serve` runs: the model loads in the core process
        shared_executor()  # skips without the embedded model
        engine = {"config": core_config(max_num_seqs=4), "engine_core": "process"}
        timeout = 3.0  # a fresh process: its first steps of each shape are slower
    status = run_server(port=port, shutdown_timeout=timeout, log_level="warning", **engine)
    client.join(60)
    assert status == 0
    assert "error" not in results, results["error"]
    assert results["accepted_after_sigterm"] is False
    assert results["hung"] is False
    assert results["short"] == {"finish_reason": "length", "done": True}
    # Cut off at the shutdown timeout, cleanly: an abort, then [DONE].
    assert results["long"] == {"finish_reason": "abort", "done": True}
    assert "Traceback" not in capfd.readouterr().err
