"""A simulated run recorded for the view, saved, loaded back and served by `heddle view`'s app."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from heddle.cli import main
from heddle.errors import HeddleError
from heddle.metrics.jsonl import record_to_dict
from heddle.view.cli import build_view_app, load_store
from heddle.view.saved import FORMAT, load_run, view_path_for
from tests.view.factories import recorded_run


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    result, recorder = recorded_run()
    directory = tmp_path_factory.mktemp("run")
    run_json = directory / "run.json"
    run_json.write_text(json.dumps({"records": [record_to_dict(r) for r in result.records]}))
    recorder.save(view_path_for(run_json), result.records)
    return run_json, result


def test_the_saved_view_holds_every_step_request_and_preemption(saved) -> None:
    run_json, result = saved
    with gzip.open(view_path_for(run_json), "rt") as f:
        assert json.loads(f.readline())["format"] == FORMAT  # JSON lines, a header first
    store = load_run(run_json)  # finds the .view.json.gz beside the run's JSON
    meta = store.meta()
    assert meta["num_steps"] == result.num_steps
    assert meta["num_requests"] == len(result.records) == 40
    assert meta["classes"] == ["batch", "chat"]
    window = store.steps(max_points=50)
    assert len(window["t"]) <= 50
    assert sum(window["n"]) == result.num_steps
    assert sum(window["preempted"]) == result.num_preemptions > 0
    tokens = sum(
        sum(a * n for a, n in zip(col, window["n"], strict=True))
        for group in ("prefill", "decode")
        for col in window[group].values()
    )
    # Means per bucket are rounded to 0.01 token: the sum is exact to that.
    assert tokens == pytest.approx(sum(s.num_tokens for s in result.step_stats), abs=0.01 * 50)
    # KV gauges never exceed the pool.
    full = store.steps()
    used = [sum(col[i] for col in full["kv_used"].values()) for i in range(len(full["t"]))]
    totals = [u + f + c for u, f, c in zip(used, full["kv_free"], full["kv_cached"], strict=True)]
    assert max(totals) == pytest.approx(48, abs=0.05)


def test_latency_cdfs_and_goodput_per_class(saved) -> None:
    run_json, result = saved
    latency = load_run(run_json).latency()
    assert set(latency["classes"]) == {"all", "chat", "batch"}
    chat = latency["classes"]["chat"]
    assert chat["completed"] == 26
    ttfts = sorted(r.ttft for r in result.records if r.request_class == "chat")
    assert chat["ttft"]["x"][-1] == pytest.approx(ttfts[-1], abs=1e-6)
    assert chat["ttft"]["y"][-1] == 1.0
    chats = [r for r in result.records if r.request_class == "chat"]
    met = sum(1 for r in chats if r.ttft <= 0.05 and (r.tpot is None or r.tpot <= 0.02))
    assert chat["slo_met"] == met


def test_drill_down_of_a_preempted_request(saved) -> None:
    run_json, result = saved
    victim = max(result.records, key=lambda r: r.num_preemptions)
    detail = load_run(run_json).request(victim.request_id)
    assert detail is not None
    assert "preempted" in detail["text"]
    kinds = [s["kind"] for s in detail["segments"]]
    assert "decode" in kinds
    # The segments tile the request's life from arrival to finish.
    segments = detail["segments"]
    assert segments[0]["start"] == pytest.approx(victim.arrival_time, abs=1e-6)
    assert segments[-1]["end"] == pytest.approx(victim.finish_time, abs=1e-6)
    # Each time it came back it recomputed first: the recompute/decode boundary is the step
    # its recompute event says it had its KV again.
    assert len(detail["recomputes"]) == victim.num_preemptions
    for recompute in detail["recomputes"]:
        assert recompute["t1"] is not None and recompute["tokens"] > 0
        (piece,) = [
            s
            for s in segments
            if s["kind"] == "recompute" and s["start"] == pytest.approx(recompute["t0"])
        ]
        assert piece["end"] == pytest.approx(recompute["t1"])
        after = segments[segments.index(piece) + 1]
        assert after["start"] == pytest.approx(recompute["t1"])
        assert after["kind"] != "recompute"
    assert "recomputed" in detail["text"]


def test_the_view_app_serves_the_page_and_its_api(saved, tmp_path: Path) -> None:
    run_json, result = saved
    sweep = tmp_path / "sweep.json"
    points = [
        {"offered_load": r, "request_throughput": min(r, 8.0), "ttft_p99": 0.05 * (1 + (r > 8) * 9)}
        for r in (2.0, 4.0, 8.0, 16.0)
    ]
    sweep.write_text(json.dumps({"points": points}))
    client = TestClient(build_view_app(load_store(str(run_json), sweep=str(sweep))))
    page = client.get("/dashboard")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert client.get("/dashboard/static/uPlot.iife.min.js").text.startswith("/*! https://")
    assert client.get("/dashboard/static/nope.js").status_code == 404
    assert client.get("/dashboard/api/meta").json()["num_steps"] == result.num_steps
    bad = client.get("/dashboard/api/steps?max=0")
    assert bad.status_code == 400 and "max" in bad.json()["error"]["message"]
    assert client.get("/dashboard/api/request/nobody").status_code == 404
    assert client.get("/dashboard/api/requests?sort=color").status_code == 400
    listed = client.get("/dashboard/api/requests?sort=preemptions&limit=3").json()
    assert listed[0]["preemptions"] == max(r.num_preemptions for r in result.records)
    knee = client.get("/dashboard/api/pictures").json()["knee"]
    assert knee["knee"] == 8.0 and "8 req/s" in knee["sentence"]
    rejected = client.post("/dashboard/api/pictures", content=b'{"points": 3}')
    assert rejected.status_code == 400
    profile = {
        "format": "heddle-step-profile/1",
        "coefficients": {"constant": 0.01, "decode_tokens": 0.0001},
        "metadata": {"machine": "test"},
    }
    step_time = client.post("/dashboard/api/pictures", json=profile).json()["step_time"]
    assert step_time["curve"]["step"][0] == pytest.approx(0.0101)
    assert "twice a single sequence's time only at a batch of 128" in step_time["sentence"]


def test_a_bench_run_shows_its_requests_without_steps(tmp_path: Path, saved) -> None:
    _, result = saved
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "config": {"base_url": "http://127.0.0.1:1"},
                "summary": {"slo": {"ttft": 0.5, "tpot": None}},
                "records": [record_to_dict(r) for r in result.records[:5]],
            }
        )
    )
    store = load_run(bench)
    meta = store.meta()
    assert meta["num_steps"] == 0 and meta["num_requests"] == 5
    assert "client" in meta["info"]["note"]
    assert store.latency()["classes"]["all"]["completed"] == 5


def test_bad_run_files_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2")
    with pytest.raises(HeddleError, match="cannot read"):
        load_run(junk)
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(HeddleError, match="neither a saved view"):
        load_run(other)
    assert main(["view", str(tmp_path / "missing.json"), "--no-open"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"heddle: error: no run file at {tmp_path / 'missing.json'}"]
    assert main(["view", str(other), "--no-open", "--profile", str(other)]) == 2
