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
    _, _, steps_on, events_on = events_cost.run(150, RATE, 0, DEFAULT_CAPACITY)
    _, _, steps_probe, events_probe = events_cost.run(150, RATE, 0, DEFAULT_CAPACITY, probe=True)
    assert (steps_probe, events_probe) == (steps_on, events_on)  # the same run, observed
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
