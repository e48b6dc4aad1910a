"""The load client's pieces, and its pacing against a fast model-free server."""

from __future__ import annotations

import argparse
import itertools

import pytest

from heddle.bench import add_arguments, parse_slo, run_bench, run_from_args
from heddle.bench.client import api_root
from heddle.bench.prompts import prompt_for, text_prompt
from heddle.bench.stream import spread_times
from heddle.cli.flags import parse_key_values
from heddle.errors import HeddleError
from heddle.metrics import SLO
from heddle.workloads import Workload, WorkloadRequest
from tests.server.fakes import make_engine
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def fake_server():
    live = LiveServer(make_engine(num_blocks=512, max_model_len=1024, step_time=0.01)).start()
    yield live
    live.stop()


def test_spread_times_keeps_the_ends_and_the_mean_gap():
    assert spread_times([1.0, 2.0, 3.0], 3) == [1.0, 2.0, 3.0]
    assert spread_times([1.0, 3.0], 5) == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert spread_times([1.0, 2.0, 3.0, 4.0, 5.0], 3) == [1.0, 3.0, 5.0]
    assert spread_times([2.0], 3) == [2.0, 2.0, 2.0]
    assert spread_times([], 3) == [] and spread_times([1.0], 0) == []


def test_parse_slo():
    assert parse_slo("ttft=0.5,tpot=50ms") == SLO(ttft=0.5, tpot=0.05)
    assert parse_slo("TTFT=2s") == SLO(ttft=2.0)
    assert parse_slo(None) is None
    for bad in ("ttft", "e2e=1", "ttft=fast", "ttft=-1"):
        with pytest.raises(HeddleError):
            parse_slo(bad)


def test_options_and_urls():
    assert parse_key_values(["input_len=256", "arrival=gamma", "long-share=0.2"]) == {
        "input_len": 256,
        "arrival": "gamma",
        "long_share": 0.2,
    }
    with pytest.raises(HeddleError):
        parse_key_values(["oops"])
    assert api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--concurrency", "8", "--slo", "ttft=1", "--prompt-mode", "text"])
    assert (args.concurrency, args.slo, args.prompt_mode) == (8, "ttft=1", "text")


def test_prompts_are_deterministic_and_sized():
    request = WorkloadRequest("a", 0.0, 40, 5, prompt_seed=3)
    ids = prompt_for(request, "tokens", vocab_size=1000)
    assert ids == prompt_for(request, "tokens", vocab_size=1000)
    assert isinstance(ids, list) and len(ids) == 40 and all(100 <= i < 1000 for i in ids)
    text = prompt_for(request, "text", vocab_size=1000)
    assert isinstance(text, str) and len(text.split()) == 40
    assert text_prompt(10, 1) == text_prompt(10, 1) != text_prompt(10, 2)
    with pytest.raises(HeddleError):
        prompt_for(request, "images", vocab_size=1000)


def test_open_loop_sends_on_schedule(fake_server):
    arrivals = [0.0, 0.3, 0.6]
    requests = [WorkloadRequest(f"r{i}", t, 8, 3) for i, t in enumerate(arrivals)]
    result = run_bench(fake_server.base_url, Workload("w", {}, 0, requests), request_rate=1.0)
    sent = sorted(r.arrival_time for r in result.records)
    assert sent == pytest.approx(arrivals, abs=0.1)
    assert all(r.num_output_tokens == 3 for r in result.records)


def test_closed_loop_keeps_the_concurrency(fake_server):
    requests = [WorkloadRequest(f"r{i}", 0.0, 8, 4) for i in range(4)]
    result = run_bench(fake_server.base_url, Workload("w", {}, 0, requests), concurrency=1)
    records = sorted(result.records, key=lambda r: r.arrival_time)
    for before, after in itertools.pairwise(records):
        assert after.arrival_time >= before.finish_time


def test_max_duration_cuts_the_run_short(fake_server):
    requests = [WorkloadRequest("long", 0.0, 8, 500), WorkloadRequest("late", 5.0, 8, 2)]
    result = run_bench(
        fake_server.base_url, Workload("w", {}, 0, requests), request_rate=1.0, max_duration=0.5
    )
    assert result.num_not_sent == 1
    (record,) = result.records
    assert record.request_id == "long" and record.finish_reason == "abort"
    assert result.wall_time < 2.0
    assert result.summary.overall.num_failed == 1
    fake_server.assert_pool_whole()  # the cut-off request was aborted on the server


def test_run_from_args_prints_and_writes(fake_server, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--base-url", fake_server.base_url,
            "--workload", "random",
            "--workload-option", "input_len=16",
            "--workload-option", "output_len=3",
            "--num-requests", "4",
            "--concurrency", "2",
            "--vocab-size", "1000",
            "--slo", "ttft=5,tpot=1",
            "--output-dir", str(tmp_path),
            "--no-progress",
        ]
    )  # fmt: skip
    assert run_from_args(args) == 0
    out = capsys.readouterr().out
    assert "4 completed, 0 failed" in out and "goodput" in out
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench_cdf.png").is_file()
