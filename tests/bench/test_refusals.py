"""The load client against a server that refuses (HTTP 429): refusals are counted apart from
errors, per class, with Retry-After honoured or not, and goodput counts them as offered."""

from __future__ import annotations

import json

import pytest

from heddle.bench import run_bench
from heddle.bench.stream import retry_after_seconds
from heddle.errors import HeddleError
from heddle.metrics import SLO
from heddle.workloads import AgentCall, AgentProgram, Workload, WorkloadRequest
from tests.server.fakes import make_engine
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def refusing_server():
    # One seat and room for one waiting request per class: of six requests sent at once, three
    # per class, at least one per class finds its queue full (two when the first has not yet
    # taken the seat) while the first holds the seat for 100 steps of 10 ms (long enough that a
    # loaded machine's client still sends all six inside it).
    engine = make_engine(
        num_blocks=512,
        max_model_len=1024,
        step_time=0.01,
        max_num_seqs=1,
        admission="queue",
        admission_options={"max_waiting": 1},
    )
    live = LiveServer(engine).start()
    yield live
    live.stop()


def burst(num: int, output_len: int, classes: tuple[str, ...] = ("bulk", "chat")) -> Workload:
    requests = [
        WorkloadRequest(f"r{i}", 0.0, 8, output_len, request_class=classes[i % len(classes)])
        for i in range(num)
    ]
    return Workload("w", {}, 0, requests)


def test_retry_after_header_forms():
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(" 0 ") == 0.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    # An HTTP date 5 s after `now` (Sun, 06 Nov 1994 08:49:37 GMT = 784111777).
    assert retry_after_seconds("Sun, 06 Nov 1994 08:49:42 GMT", now=784111777.0) == 5.0


def test_refusals_are_counted_apart_from_errors(refusing_server):
    result = run_bench(
        refusing_server.base_url,
        burst(6, 100),
        request_rate=100.0,
        slo=SLO(ttft=5.0),
    )
    report = result.refusals
    assert report is not None and not report.honoured
    overall = report.overall
    assert overall.offered == 6 and overall.refused >= 2
    assert overall.served + overall.refused == 6
    assert overall.refusals == overall.refused and overall.retried == 0
    assert overall.retry_after_mean == 1.0  # the queue bound's Retry-After
    assert sum(c.offered for n, c in report.classes.items() if n != "all") == 6
    assert all(c.refused >= 1 for n, c in report.classes.items() if n != "all")
    # Not errors, not records of the summary; goodput over offered counts them as not good.
    assert result.errors == {} and result.summary.overall.num_failed == 0
    assert len(result.records) == overall.served
    assert overall.within_slo == overall.served
    assert overall.slo_attainment == pytest.approx(overall.served / 6)
    saved = json.loads(json.dumps(result.to_dict(with_records=False)))  # what bench.json holds
    assert saved["refusals"]["classes"]["all"]["refused"] == overall.refused
    assert len(saved["refused"]) == overall.refused
    assert all("queue" in r["message"] and r["retry_after"] == 1.0 for r in saved["refused"])
    refusing_server.assert_pool_whole()


def test_retry_after_is_honoured_when_asked(refusing_server):
    # One class: of three sent at once the third finds the queue full whether or not the first
    # has taken the seat yet.
    result = run_bench(
        refusing_server.base_url, burst(3, 5, ("chat",)), request_rate=100.0, retry_refused=5
    )
    report = result.refusals
    assert report is not None and report.honoured
    overall = report.overall
    assert overall.refused == 0 and overall.served == 3  # each retried until it got in
    assert overall.retried >= 1 and overall.served_after_retry == overall.retried
    assert overall.refusals >= overall.retried
    # A retried request's latency runs from its first attempt: at least one Retry-After.
    slow = sorted(r.ttft for r in result.records if r.ttft is not None)[-overall.retried :]
    assert all(t >= 1.0 for t in slow)
    refusing_server.assert_pool_whole()


def test_agent_client_counts_refused_calls_apart_from_errors(refusing_server):
    # Six one-call-then-more programs sent at once to one seat and one waiting place per
    # class: some first calls are refused. A refused call ends its program (as an error would)
    # but is a refusal: counted in the same report as the completions client's, not an error.
    programs = [
        AgentProgram(
            f"p{i}",
            0.0,
            (AgentCall(8, 40, 0.0, "none"), AgentCall(4, 2, 0.0, "none")),
            seed=f"s{i}",
            request_class=("bulk", "chat")[i % 2],
        )
        for i in range(6)
    ]
    workload = Workload("agents", {}, 0, [p.first_request() for p in programs], programs)
    result = run_bench(refusing_server.base_url, workload, request_rate=100.0)
    assert result.errors == {}
    report = result.refusals
    assert report is not None and not report.honoured
    overall = report.overall
    assert overall.refused >= 2 and overall.refusals == overall.refused
    assert overall.offered == overall.served + overall.refused
    assert overall.retry_after_mean == 1.0
    assert len(result.records) == overall.served  # refused calls are not records
    assert result.programs is not None
    assert result.programs.num_failed == overall.refused  # each refused call ended a program
    saved = json.loads(json.dumps(result.to_dict(with_records=False)))
    assert len(saved["refused"]) == overall.refused
    assert all("queue" in r["message"] for r in saved["refused"])
    refusing_server.assert_pool_whole()


def test_agent_client_refuses_retry_option(refusing_server):
    program = AgentProgram("p", 0.0, (AgentCall(8, 2, 0.0, "none"),), seed="s")
    workload = Workload("agents", {}, 0, [program.first_request()], [program])
    with pytest.raises(HeddleError, match="retry-refused"):
        run_bench(refusing_server.base_url, workload, request_rate=10.0, retry_refused=1)
