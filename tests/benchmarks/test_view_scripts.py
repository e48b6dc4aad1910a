"""benchmarks/events_cost.py and view_overhead.py: the verdicts of runs cut short, and the probe's
arm (small runs; the timed figures are docs/VIEW.md's)."""

from __future__ import annotations

import importlib

import pytest

from heddle.core.events import DEFAULT_CAPACITY

pytestmark = pytest.mark.usefixtures("benchmarks_on_path")

RATE = 27.275639319603314


def _line(n: int, arm: str, wall: float, steps: int = 1000, events: int = 10) -> str:
    return (
        f"  {n} requests, events {arm:>5}: {wall:6.2f} s wall, {wall:6.2f} s CPU (0.05 s in the "
        f"garbage collector), {steps} steps, {events if arm != 'off' else 0} events"
    )


def test_from_log_summarizes_whole_pairs_of_a_cut_run(tmp_path):
    events_cost = importlib.import_module("events_cost")
    log = tmp_path / "events_cost.log"
    log.write_text(
        "\n".join(
            [
                "machine line; chat at 27.3 req/s",
                _line(100, "on", 2.2),
                _line(100, "off", 2.0),
                _line(100, "off", 2.0),
                _line(100, "on", 2.1),
                _line(200, "on", 4.4, steps=2000),
                _line(200, "off", 4.0, steps=2000),
                _line(200, "off", 4.1, steps=2000),  # cut here: no 'on' for this pair
                "100 requests: a summary line is not a run",
            ]
        )
        + "\n"
    )
    first, second = events_cost.from_log(str(log))
    assert first["num_requests"] == 100 and first["num_pairs"] == 2
    assert first["pairs"] == pytest.approx([0.1, 0.05])
    assert first["overhead_paired"] == pytest.approx(0.075)
    assert first["cost_per_step_us"] == pytest.approx(1e6 * (2.15 - 2.0) / 1000)
    assert second["num_pairs"] == 1 and second["pairs"] == pytest.approx([0.1])
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(SystemExit, match="no runs"):
        events_cost.from_log(str(empty))


def test_the_probe_arm_runs_the_probe_and_leaves_the_schedule_alone(monkeypatch):
    events_cost = importlib.import_module("events_cost")
    from heddle.view import live

    drained: list[int] = []
    real_source = live.view_source

    def counting_source(engine):
        drain = real_source(engine)

        def counted():
            out = drain()
            drained.append(sum(len(message["steps"]) for message in out))
            return out

        return counted

    monkeypatch.setattr(live, "view_source", counting_source)
    _, _, steps_on, events_on, digest_on = events_cost.run(150, RATE, 0, DEFAULT_CAPACITY)
    *_, steps_probe, events_probe, digest_probe = events_cost.run(
        150, RATE, 0, DEFAULT_CAPACITY, probe=True
    )
    assert (steps_probe, events_probe) == (steps_on, events_on)  # the same run, observed
    assert digest_probe == digest_on
    assert len(drained) == steps_probe and set(drained) == {1}  # one row drained every step


def test_view_overhead_verdict_from_rounds(tmp_path):
    view_overhead = importlib.import_module("view_overhead")
    rounds = [
        {"arm": arm, "label": f"{arm}-{i}", "output_throughput": tput, "tpot_mean": 0.1,
         "completed": 64, "wall_time": 10.0,
         "cpu_s": {"core": 10.0, "front_end": 0.5, "browser": 2.0 if arm == "open" else 0.0}}
        for i, (arm, tput) in enumerate(
            [("closed", 100.0), ("open", 97.0), ("open", 99.0), ("closed", 101.0)]
        )
    ]  # fmt: skip
    out = tmp_path / "summary.json"
    kwargs = dict(machine="m", isolate_cpus=True, core_cpu=0, concurrency=64, output=str(out))
    view_overhead.summarize(rounds, [], [], **kwargs)
    summary = importlib.import_module("json").loads(out.read_text())
    assert summary["throughput_closed"] == pytest.approx(100.5)
    assert summary["throughput_open"] == pytest.approx(98.0)
    assert summary["slowdown"] == pytest.approx(1 - 98.0 / 100.5)
    assert summary["rounds"] == 2 and summary["lag_ms_p50"] is None
    with pytest.raises(SystemExit, match="no pair"):
        view_overhead.summarize(rounds[:1], [], [], **kwargs)
    # CPU per process: one gone by the second reading counts nothing (not minus its total).
    assert view_overhead.cpu_delta({1: 5.0, 2: 3.0}, {1: 6.5}) == pytest.approx(1.5)


def test_events_on_and_off_make_the_same_decisions():
    """The digest each arm reports (every request's admission and finish times, preemptions,
    cached tokens, stall time) is the same with the log on and off, and tells runs apart."""
    events_cost = importlib.import_module("events_cost")
    # Past saturation (400 req/s), so that requests wait and the log has something to say.
    on = events_cost.one_arm(200, 400.0, 0, "on")
    off = events_cost.one_arm(200, 400.0, 0, "off")
    assert on["events"] > 0 and off["events"] == 0
    assert (on["steps"], on["digest"]) == (off["steps"], off["digest"])
    assert events_cost.one_arm(200, 400.0, 1, "off")["digest"] != off["digest"]


def test_instruction_counts_need_valgrind_and_read_callgrinds_totals(tmp_path, monkeypatch):
    import subprocess
    import sys

    events_cost = importlib.import_module("events_cost")
    monkeypatch.setattr(events_cost.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="needs valgrind"):
        events_cost.start_count(100, RATE, 0, "on", tmp_path)
    with pytest.raises(SystemExit, match="two --num-requests"):
        events_cost.instructions([100], RATE, 0, tmp_path)
    # What a finished callgrind run leaves: the arm's result on stdout, the totals in its file.
    out_file = tmp_path / "callgrind.on.100.out"
    out_file.write_text(
        "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\nsummary: 1000\nfn=x\n"
        "totals: 1000 400 200 7 30 20 1 3 2\n"
    )
    arm = '{"steps": 10, "digest": "ab", "events": 3}'
    proc = subprocess.Popen([sys.executable, "-c", f"print({arm!r})"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    result = events_cost.collect_count((proc, out_file, True))
    assert result["instructions"] == 1000 and result["steps"] == 10
    assert result["cache"]["D1mr"] == 30 and result["cache"]["DLmw"] == 2
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    with pytest.raises(SystemExit, match="exit 3"):
        events_cost.collect_count((failed, out_file, False))
