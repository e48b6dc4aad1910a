"""`heddle serve --replicas 2` for real: a local Ray on 127.0.0.1, two replicas of the embedded
model (one thread each), the OpenAI front end, a replica killed mid-stream under load.

One server for the module (Ray start-up and two model loads take ~15 s; the module ~60 s).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.live import free_port

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
NUM_STREAMS = 16
ROOT = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (Ray's GCS, raylet, workers...)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the server's child process: a SIGTERM when pytest dies (a run killed by a timeout
    cannot reach the fixture's teardown), so no server or Ray cluster outlives the tests."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = open(ROOT / "results" / "test_ray_serve.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "heddle", "serve", "--replicas", "2", "--num-threads", "1",
                "--port", str(self.port), "--max-model-len", "512", "--num-blocks", "256",
                "--log-level", "warning", "--router", "affinity", "--dtype", "float32",
            ],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not come up")
            time.sleep(0.5)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("heddle_replica") or line.startswith("heddle_failovers"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def replica_pids(self) -> list[int]:
        return [p for p in descendants(self.proc.pid) if "ray::EngineReplica" in cmdline(p)]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        finally:
            self.log.close()


@pytest.fixture(scope="module")
def server():
    (ROOT / "results").mkdir(exist_ok=True)
    s = Server()
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait(30)


def prompt(i: int) -> str:
    return f"Question {i}: list three facts about the number {i * 7 + 3}."


async def stream_one(client: httpx.AsyncClient, base: str, i: int, seen: list[int]) -> dict:
    body = {
        "model": None, "prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    body.pop("model")
    text, usage, errors, finish = "", None, [], None
    async with client.stream("POST", f"{base}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event)
                continue
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                text += choice["text"]
                seen[0] += 1
                finish = choice.get("finish_reason") or finish
    return {"text": text, "usage": usage, "errors": errors, "finish": finish}


async def load(base: str, on_progress=None) -> list[dict]:
    seen = [0]
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        tasks = [asyncio.create_task(stream_one(client, base, i, seen)) for i in range(NUM_STREAMS)]
        if on_progress is not None:
            while not all(t.done() for t in tasks):
                on_progress(seen[0])
                await asyncio.sleep(0.05)
        return await asyncio.gather(*tasks)


def test_a_session_stays_on_its_replica(server: Server) -> None:
    def routed() -> list[float]:
        m = server.metrics()
        return [m[f'heddle_replica_routed_total{{replica="{i}"}}'] for i in range(2)]

    context = "You are a helpful assistant. " * 40 + "User: tell me a story about a loom."
    homes = []
    for turn in range(3):
        before = routed()
        response = httpx.post(
            f"{server.base}/v1/completions",
            json={"prompt": context, "max_tokens": 8, "temperature": 0.0},
            timeout=60,
        )
        assert response.status_code == 200
        context += response.json()["choices"][0]["text"] + f" User: and then {turn}?"
        after = routed()
        homes.append([b - a for a, b in zip(before, after, strict=True)].index(1.0))
    assert homes == [homes[0]] * 3


def test_kill_one_replica_mid_stream(server: Server) -> None:
    calm = asyncio.run(load(server.base))
    assert all(not r["errors"] and r["usage"]["completion_tokens"] == MAX_TOKENS for r in calm)

    pids = server.replica_pids()
    assert len(pids) == 2
    victim = pids[0]
    killed = []

    def kill_when_streaming(num_events: int) -> None:
        if not killed and num_events >= NUM_STREAMS * 4:
            os.kill(victim, signal.SIGKILL)
            killed.append(num_events)

    moved = asyncio.run(load(server.base, kill_when_streaming))
    assert killed, "the load finished before the kill"
    for before, after in zip(calm, moved, strict=True):
        assert after["errors"] == []
        assert after["finish"] == "length"
        assert after["usage"]["completion_tokens"] == MAX_TOKENS
        assert after["text"] == before["text"]  # greedy: identical, nothing lost or repeated
    metrics = server.metrics()
    assert metrics["heddle_failovers_total"] >= 1

    # Ray restarts the replica; the router takes it back once it answers its health probe.
    deadline = time.monotonic() + 120
    while True:
        m = server.metrics()
        if all(m[f'heddle_replica_healthy{{replica="{i}"}}'] == 1.0 for i in range(2)):
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.5)
    time.sleep(1.0)  # a health round after the last stream: fresh reports from both
    m = server.metrics()
    for i in range(2):  # no KV leaked, nothing left running
        assert m[f'heddle_replica_kv_cache_usage_ratio{{replica="{i}"}}'] == 0.0
        assert m[f'heddle_replica_num_requests_running{{replica="{i}"}}'] == 0.0
    assert victim not in server.replica_pids()
    assert len(server.replica_pids()) == 2


def listening_addresses(pids: set[int]) -> set[str]:
    """Local addresses of the TCP sockets these processes listen on."""
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.add(line.split()[3].rsplit(":", 1)[0])
    return found


def test_server_exits_cleanly_and_leaves_no_ray_process(server: Server) -> None:
    ray_processes = descendants(server.proc.pid)
    assert any(re.search(r"raylet|gcs_server", cmdline(p)) for p in ray_processes)
    # Ray (GCS, raylet, workers) and the HTTP server listen on loopback only.
    addresses = listening_addresses(ray_processes | {server.proc.pid})
    assert addresses and addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, addresses
    assert server.stop() == 0
    deadline = time.monotonic() + 30
    while any(alive(p) for p in ray_processes):
        assert time.monotonic() < deadline, [cmdline(p) for p in ray_processes if alive(p)]
        time.sleep(0.2)
