"""The dashboard in a real browser (headless Chromium): a replayed simulation and a live server
under a bounded load. Each panel must draw data, not merely load; screenshots go to
results/view/."""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.engine.core_client import CoreClient
from heddle.engine.core_process import engine_from_config
from heddle.metrics.jsonl import record_to_dict
from heddle.view.cli import build_view_app, load_store
from heddle.view.live import view_source
from heddle.view.saved import view_path_for
from tests.server.live import MAX_MODEL_LEN, AppServer, LiveServer, require_embedded_model
from tests.view.browser import launch, open_dashboard, screenshot, view_stats
from tests.view.factories import recorded_run

PANELS = ("chart-tokens", "chart-batch", "chart-kv", "chart-queues", "chart-ttft", "chart-e2e")


@pytest.fixture(scope="module")
def browser() -> Any:
    yield from launch()


def canvases(page: Any, chart_id: str) -> int:
    return int(page.locator(f"#{chart_id} canvas").count())


def test_replayed_simulation_draws_every_panel(browser: Any, tmp_path: Path) -> None:
    result, recorder = recorded_run()
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"records": [record_to_dict(r) for r in result.records]}))
    recorder.save(view_path_for(run_json), result.records)
    sweep = tmp_path / "sweep.json"
    points = [
        {"offered_load": r, "request_throughput": min(r, 9.0), "ttft_p99": 0.04 if r < 9 else r}
        for r in (2, 4, 8, 12, 16)
    ]
    sweep.write_text(json.dumps({"points": points}))
    store = load_store(str(run_json), sweep=str(sweep))
    with AppServer(build_view_app(store)) as server:
        page = open_dashboard(browser, f"{server.url}/dashboard")
        try:
            stats = view_stats(page)
            # Every step of the run is drawn (in buckets, each counting its steps).
            assert stats["stepsDrawn"] == result.num_steps == stats["stepsSeen"]
            assert int(page.inner_text("#num-steps")) == result.num_steps
            for chart in (*PANELS, "chart-steptime", "chart-knee"):
                assert canvases(page, chart) >= 1, f"{chart} drew nothing"
            foot = page.inner_text("#timeline-foot")
            assert f"{result.num_preemptions} preemptions" in foot
            assert "Up to about 8 req/s" in page.inner_text("#knee-sentence")
            goodput = page.inner_text("#goodput")
            assert "chat" in goodput and "batch" in goodput and "within SLO" in goodput
            # The request most preempted: its drill-down says so.
            page.select_option("#request-sort", "preemptions")
            victim = max(result.records, key=lambda r: r.num_preemptions)
            page.wait_for_selector(f'#request-list tr[data-id="{victim.request_id}"]')
            page.click(f'#request-list tr[data-id="{victim.request_id}"]')
            page.wait_for_function(f"window.heddleView.ready.request === '{victim.request_id}'")
            why = page.inner_text("#why")
            assert "preempted" in why and "because" in why  # reasons, from the decision events
            assert page.locator("#request-lane .seg[data-kind=preempted]").count() >= 1
            assert page.locator("#request-lane .seg[data-kind=decode]").count() >= 1
            assert page.locator("#request-reasons tr[data-reason]").count() >= 1
            screenshot(page, "replay", ("timeline", "kv", "queues", "latency", "request"))
            # Drag across the timeline: the page asks for that window only.
            page.locator("#chart-tokens").scroll_into_view_if_needed()
            box = page.locator("#chart-tokens .u-over").bounding_box()
            y = box["y"] + box["height"] / 2
            page.mouse.move(box["x"] + box["width"] * 0.25, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
            page.mouse.up()
            page.wait_for_function(
                f"window.heddleView.stats.stepsDrawn < {result.num_steps}", timeout=10_000
            )
            assert 0 < view_stats(page)["stepsDrawn"] < result.num_steps
            assert page.errors == []  # type: ignore[attr-defined]
        finally:
            page.close()


# The engine core loads the model in a process of its own: about 5 s on a quiet machine, but
# 60-128 s was seen on a loaded one. Bounded, but generous.
CORE_STARTUP_TIMEOUT_S = 300.0
LOAD_TIMEOUT_S = 300.0  # 12 requests of 48 tokens: seconds on a quiet machine


@pytest.mark.slow
def test_live_server_dashboard_follows_a_bounded_load(browser: Any) -> None:
    """As `heddle serve` runs by default: the engine core in its own process, the view's rows
    and decision events over the core's channel (`view_source`)."""
    require_embedded_model()  # skips where it is not installed (the core loads it)
    # 24 KV blocks (384 tokens) for 8 concurrent requests of ~64 tokens: some are preempted.
    config = EngineConfig(
        # One torch thread: on a loaded machine two threads wait on each other at every op.
        model=ModelConfig(num_threads=1, max_model_len=MAX_MODEL_LEN, quantization="none"),
        cache=CacheConfig(block_size=16, num_blocks=24),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
    )
    client = CoreClient(
        functools.partial(engine_from_config, config),
        event_source=view_source,
        startup_timeout=CORE_STARTUP_TIMEOUT_S,
    )
    started = time.monotonic()
    client.start()  # waits for the core's model load (raises past the timeout)
    server = None
    page = None
    try:
        server = LiveServer(client=client).start()
        _wait_healthy(server.base_url, CORE_STARTUP_TIMEOUT_S - (time.monotonic() - started))
        page = open_dashboard(browser, f"{server.base_url}/dashboard")
        assert page.inner_text("#mode") == "live"
        _send_load(server.base_url, num_requests=12, concurrency=8, timeout=LOAD_TIMEOUT_S)
        server.wait_idle(60)
        health = httpx.get(f"{server.base_url}/health").json()["engine"]
        steps = health["num_steps"]
        assert steps > 0 and health["num_preemptions_total"] > 0
        # The page catches up with the server's step counter and draws every step.
        page.wait_for_function(
            f"window.heddleView.stats.stepsSeen === {steps}"
            f" && window.heddleView.stats.stepsDrawn === {steps}",
            timeout=20_000,
        )
        stats = view_stats(page)
        lags = sorted(stats["lags"])
        assert lags and lags[len(lags) // 2] < 1000, f"median page lag {lags[len(lags) // 2]} ms"
        for chart in PANELS:
            page.wait_for_selector(f"#{chart} canvas", timeout=10_000)
        # A request the engine preempted: its drill-down shows the preemption.
        rows = httpx.get(f"{server.base_url}/dashboard/api/requests?sort=preemptions").json()
        victim = rows[0]
        assert victim["preemptions"] > 0
        page.fill("#request-id", victim["id"])
        page.click("#request-form button")
        page.wait_for_function(f"window.heddleView.ready.request === '{victim['id']}'")
        assert "preempted" in page.inner_text("#why")
        assert page.locator("#request-lane .seg[data-kind=preempted]").count() >= 1
        screenshot(page, "live", ("timeline", "request", "pictures"))
        assert page.errors == []  # type: ignore[attr-defined]
        assert client.stats.kv_blocks_used == 0  # the core's pool is whole again
    finally:
        if page is not None:
            page.close()  # closes its event stream before the server stops
        if server is not None:
            server.stop()
        client.shutdown()


def _wait_healthy(base_url: str, timeout: float) -> None:
    """Until /health answers 200 (the server is up over a ready core), at most `timeout` s."""
    deadline = time.monotonic() + max(timeout, 10.0)
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}/health", timeout=5)
            if response.status_code == 200:
                return
            last = f"{response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.25)
    raise AssertionError(f"the server over the engine core was not healthy in time ({last})")


def _send_load(base_url: str, num_requests: int, concurrency: int, timeout: float = 120.0) -> None:
    """`num_requests` streamed completions, `concurrency` at a time; bounded by `timeout`."""
    failures: list[str] = []
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        with httpx.Client(base_url=base_url, timeout=timeout) as client:
            while True:
                with lock:
                    index = next_index[0]
                    next_index[0] += 1
                if index >= num_requests:
                    return
                body = {
                    "prompt": f"Request {index}: tell me a story about a loom and its heddles.",
                    "max_tokens": 48,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                }
                with client.stream("POST", "/v1/completions", json=body) as response:
                    text = "".join(response.iter_text())
                if response.status_code != 200 or "[DONE]" not in text:
                    failures.append(f"{response.status_code}: {text[:200]}")

    deadline = time.monotonic() + timeout
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not failures, failures
    assert all(not t.is_alive() for t in threads), "the load did not finish in time"
