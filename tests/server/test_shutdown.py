"""SIGTERM: stop accepting, let short requests finish, cut long ones at the timeout, exit 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from heddle.errors import ModelLoadError
from heddle.model.registry import default_model_path
from tests.server.live import free_port

pytestmark = pytest.mark.slow

SERVE = """
import sys
from heddle.config import CacheConfig, EngineConfig, ModelConfig
from heddle.server.app import run_server
config = EngineConfig(model=ModelConfig(num_threads=2), cache=CacheConfig(num_blocks=256))
sys.exit(run_server(config, port=int(sys.argv[1]), log_level="warning", shutdown_timeout=2))
"""


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


def test_sigterm_drains_and_exits_zero():
    try:
        default_model_path()
    except ModelLoadError as e:
        pytest.skip(str(e))
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        short, long = {}, {}
        events = [threading.Event(), threading.Event()]
        threads = [
            threading.Thread(target=_stream, args=(base_url, 4, events[0], short)),
            threading.Thread(target=_stream, args=(base_url, 2000, events[1], long)),
        ]
        for thread in threads:
            thread.start()
        for event in events:
            assert event.wait(60)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base_url}/health", timeout=2)
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        output = process.communicate(timeout=30)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "Traceback" not in output, output
    assert short == {"finish_reason": "length", "done": True}
    # Cut off at the shutdown timeout, cleanly: an abort, then [DONE].
    assert long == {"finish_reason": "abort", "done": True}
