"""The load client against a live heddle server (real model): sane numbers, right token counts."""

from __future__ import annotations

import json

import pytest

from heddle.bench import parse_slo, run_bench
from heddle.workloads import Workload, WorkloadRequest
from tests.server.live import API_KEY, LiveServer, real_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    live = LiveServer(real_engine(max_num_seqs=16), api_key=API_KEY).start()
    yield live
    live.stop()


def _assert_sane(result, output_lens):
    records = {r.request_id: r for r in result.records}
    assert set(records) == set(output_lens)
    assert result.errors == {}
    for request_id, record in records.items():
        assert record.finish_reason == "length"
        assert record.num_output_tokens == output_lens[request_id]
        assert record.arrival_time < record.first_token_time <= record.token_times[-1]
        assert record.ttft < record.e2e
        assert record.token_times == sorted(record.token_times)
        assert record.tpot is None or 0 < record.tpot < record.e2e
    overall = result.summary.overall
    assert overall.num_completed == len(output_lens) and overall.num_failed == 0
    assert overall.num_output_tokens == sum(output_lens.values())
    assert overall.ttft.p50 <= overall.ttft.p99 <= overall.e2e.max
    assert overall.output_throughput > 0


def test_open_loop_with_token_prompts(server, tmp_path):
    result = run_bench(
        f"{server.base_url}/v1",
        "random",
        request_rate=20.0,
        num_requests=8,
        workload_options={"input_len": 24, "output_len": 6, "range_ratio": 0.5},
        api_key=API_KEY,
        vocab_size=server.engine.vocab_size,
        slo=parse_slo("ttft=30,tpot=10"),
        output_dir=tmp_path,
        label="open",
    )
    lens = {r.request_id: r.output_len for r in result.workload_requests}
    _assert_sane(result, lens)
    prompt_lens = {r.request_id: r.prompt_len for r in result.workload_requests}
    assert {r.request_id: r.num_prompt_tokens for r in result.records} == prompt_lens
    assert result.summary.overall.goodput is not None
    assert result.summary.overall.num_within_slo == 8  # generous targets
    saved = json.loads((tmp_path / "open.json").read_text())
    assert saved["summary"]["overall"]["num_completed"] == 8
    assert len(saved["records"]) == 8
    assert (tmp_path / "open_cdf.png").stat().st_size > 0
    server.assert_pool_whole()


def test_closed_loop_with_text_prompts_and_classes(server):
    requests = [
        WorkloadRequest(f"r{i}", 0.0, 16, 3 + i % 3, request_class="short" if i % 2 else "long")
        for i in range(6)
    ]
    workload = Workload("handmade", {}, 0, requests)
    result = run_bench(
        server.base_url, workload, concurrency=2, prompt_mode="text", api_key=API_KEY
    )
    _assert_sane(result, {r.request_id: r.output_len for r in requests})
    assert set(result.summary.classes) == {"long", "short"}
    server.assert_pool_whole()


def test_failures_are_counted_not_raised(server):
    requests = [WorkloadRequest("ok", 0.0, 8, 2), WorkloadRequest("huge", 0.0, 8, 5000)]
    result = run_bench(
        server.base_url, Workload("w", {}, 0, requests), concurrency=2, api_key=API_KEY
    )
    assert set(result.errors) == {"huge"}
    assert result.errors["huge"].startswith("HTTP 400")
    assert result.summary.overall.num_completed == 1
    assert result.summary.overall.num_failed == 1


def test_agent_programs_against_the_real_model(server):
    """Chat programs with tool results: every call gets its planned length, later calls hit
    the prefix cache (the conversation so far), nothing leaks."""
    result = run_bench(
        server.base_url,
        "agent-bfcl",
        request_rate=4.0,
        num_requests=2,
        workload_options={"length_scale": 0.02, "tool_time_factor": 0.05},
        api_key=API_KEY,
    )
    assert result.errors == {}
    programs = result.programs
    assert programs is not None and programs.num_completed == 2
    planned = {r.request_id: r.output_len for r in result.workload_requests}
    assert {r.request_id: r.num_output_tokens for r in result.records} == planned
    assert programs.cache_hit_rate is not None and programs.cache_hit_rate > 0.3
    assert programs.completion_time.p99 is not None
    server.assert_pool_whole()
