from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from heddle.errors import HeddleError
from heddle.workloads import WorkloadRequest, get_workload, load_jsonl, save_jsonl, trace_path
from heddle.workloads.traces import trace_dir_candidates

TRACES = next((d for d in trace_dir_candidates() if (d / "splitwise_conv.csv").is_file()), None)
needs_traces = pytest.mark.skipif(
    TRACES is None, reason="shared traces not found (expected ../shared/traces next to the repo)"
)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    requests = [
        WorkloadRequest("a", 0.0, 5, 3),
        WorkloadRequest(
            "b",
            0.5,
            2,
            1,
            request_class="long",
            user="u",
            priority=2,
            ttft_slo=0.2,
            tpot_slo=0.05,
            prompt_token_ids=(4, 5),
        ),
        WorkloadRequest("c", 1.0, 7, 9, prompt_seed="s:1", program_id="p", call_index=1),
    ]
    path = tmp_path / "w.jsonl"
    save_jsonl(requests, path)
    assert load_jsonl(path) == requests
    assert '"prompt_token_ids"' not in path.read_text().splitlines()[0]


def test_jsonl_minimal_fields_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"arrival_time": 2, "prompt_len": 3, "output_len": 4}\n\n'
        '{"arrival_time": 1, "prompt_len": 5, "output_len": 6, "user": "x"}\n'
    )
    w = get_workload(str(path))
    assert [(r.request_id, r.arrival_time, r.prompt_len, r.user) for r in w] == [
        ("t-2", 0.0, 5, "x"),
        ("t-0", 1.0, 3, None),
    ]
    path.write_text('{"arrival_time": 0, "prompt_len": 3, "output_len": 4, "colour": 1}\n')
    with pytest.raises(HeddleError, match="unknown request field"):
        load_jsonl(path)
    path.write_text('{"arrival_time": 0, "prompt_len": 3}\n')
    with pytest.raises(HeddleError, match="output_len"):
        load_jsonl(path)
    with pytest.raises(HeddleError, match="does not exist"):
        get_workload(str(tmp_path / "nope.jsonl"))


def test_csv_path_with_scaling(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n10.0,100,20\n11.0,200,40\n13.0,300,60\n"
    )
    w = get_workload(str(path), time_scale=2.0, length_scale=0.5, max_prompt_len=120)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in w] == [
        (0.0, 50, 10),
        (2.0, 100, 20),
        (6.0, 120, 30),
    ]
    at_rate = get_workload(str(path), rate=4.0, offset=1, num_requests=2)
    assert [r.arrival_time for r in at_rate] == [0.0, 0.25]
    assert [r.request_id for r in at_rate] == ["mine-1", "mine-2"]
    with pytest.raises(HeddleError, match="either rate or time_scale"):
        get_workload(str(path), rate=4.0, time_scale=2.0)


@needs_traces
@pytest.mark.parametrize("name", ["conv", "code"])
def test_splitwise_traces(name: str) -> None:
    w = get_workload(f"trace:{name}", num_requests=500)
    assert len(w) == 500
    times = [r.arrival_time for r in w]
    assert times[0] == 0.0 and times == sorted(times)
    assert {r.request_class for r in w} == {name}
    stretched = get_workload(f"trace:{name}", num_requests=500, time_scale=3.0)
    assert stretched.requests[-1].arrival_time == pytest.approx(3 * times[-1])
    at_rate = get_workload(f"trace:{name}", num_requests=500, rate=10.0)
    assert 499 / at_rate.requests[-1].arrival_time == pytest.approx(10.0)
    small = get_workload(f"trace:{name}", num_requests=500, length_scale=0.1, max_output_len=50)
    assert statistics.mean(r.prompt_len for r in small) == pytest.approx(
        statistics.mean(r.prompt_len for r in w) * 0.1, rel=0.05
    )
    assert max(r.output_len for r in small) <= 50


@needs_traces
def test_arxiv_trace_takes_arrivals_from_a_process() -> None:
    w = get_workload("trace:arxiv", num_requests=2000, rate=5.0, seed=1)
    assert len(w) == 2000
    gaps = [
        b.arrival_time - a.arrival_time for a, b in zip(w.requests, w.requests[1:], strict=False)
    ]
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.1)
    assert statistics.mean(r.prompt_len for r in w) > 1000  # long documents
    assert trace_path("arxiv").name.startswith("arxiv")


def test_missing_traces_dir_gives_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HeddleError, match="not found in"):
        get_workload("trace:conv", traces_dir=str(tmp_path))
    with pytest.raises(HeddleError, match="unknown trace 'trace:nope'"):
        get_workload("trace:nope")
