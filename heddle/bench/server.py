"""Waiting for a server a benchmark started as a subprocess: poll its /health until it answers
200, fail at once with the tail of its log if the process exits, and give up at a deadline."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_healthy(process: subprocess.Popen[bytes], url: str, timeout: float = 300.0,
                 log: Path | None = None, client: httpx.Client | None = None,
                 poll: float = 0.5) -> None:
    """Return once GET {url}/health answers 200; RuntimeError (with the last 2,000 characters
    of `log`, if given) when the process exits first or `timeout` seconds pass."""

    def tail() -> str:
        if log is None:
            return ""
        try:
            return ":\n" + log.read_text(errors="replace")[-2000:]
        except OSError:
            return f"; see {log}"

    get = client.get if client is not None else httpx.get
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}){tail()}")
        try:
            if get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not come up in {timeout:.0f} s{tail()}")
        time.sleep(poll)
