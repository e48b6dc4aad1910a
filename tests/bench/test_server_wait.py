"""wait_healthy against real processes: a static HTTP server whose /health answers 200, one that
answers 404 until the deadline, and a process that exits before it ever listens."""

from __future__ import annotations

import subprocess
import sys

import pytest

from heddle.bench.server import wait_healthy
from heddle.hostinfo import free_port


def _http_server(root, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_waits_for_health_then_returns(tmp_path):
    (tmp_path / "health").write_text("ok")
    port = free_port()
    server = _http_server(tmp_path, port)
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}", timeout=30, poll=0.05)
    finally:
        server.terminate()
        server.wait(10)


def test_gives_up_at_the_deadline_when_health_never_answers_200(tmp_path):
    port = free_port()
    server = _http_server(tmp_path, port)  # no /health file: 404
    try:
        with pytest.raises(RuntimeError, match="did not come up in 1 s"):
            wait_healthy(server, f"http://127.0.0.1:{port}", timeout=1, poll=0.05)
    finally:
        server.terminate()
        server.wait(10)


def test_an_exited_server_fails_at_once_with_its_log(tmp_path):
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-c", "print('bad flag: --nope'); exit(2)"],
                                  stdout=out, stderr=subprocess.STDOUT)
    server.wait(10)
    with pytest.raises(RuntimeError, match=r"exited \(2\):\nbad flag: --nope"):
        wait_healthy(server, "http://127.0.0.1:9", timeout=60, log=log)
