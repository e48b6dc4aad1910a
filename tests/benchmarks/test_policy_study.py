"""Smoke test of benchmarks/policy_study: the experiment's code path on a handful of requests."""

from __future__ import annotations

import argparse
import json
import math

from benchmarks.policy_study.real import REAL_WORKLOADS, add_real_arguments, run_real
from benchmarks.policy_study.report import write_report
from benchmarks.policy_study.sim import Point, SimSetup, run_points
from benchmarks.policy_study.spec import POLICIES, SIM_ONLY, SIM_WORKLOADS, policy_options
from benchmarks.policy_study.targets import check_targets
from heddle.core.policies import make_policy


def test_sim_mode_runs_every_policy_and_writes_the_report(tmp_path):
    setup, quiet, n = SimSetup(), lambda _: None, 8
    probes = [Point("long-prompt", p, 0.0, math.inf, 0, n) for p in ("fcfs", "static")]
    capacity = run_points(probes, setup, jobs=1, probe=True, log=quiet)
    rate = capacity[0]["saturation"]["requests_per_s"]
    assert rate > 0 and capacity[1]["saturation"]["requests_per_s"] > 0
    sweep = [Point("long-prompt", p, 1.2, 1.2 * rate, 0, n) for p in POLICIES if p != "static"]
    orca = [Point("long-prompt", p, 0.5, 0.5 * rate, 0, n, tag="orca") for p in ("fcfs", "static")]
    points = run_points([*sweep, *orca], setup, jobs=1, log=quiet)
    for p in points:
        m = p["metrics"]
        assert m["overall"]["num_completed"] == n
        assert set(m["classes"]) <= {"short", "long"}
        assert m["overall"]["goodput"] is not None  # every request carries its class's SLO
    by_policy = {p["point"]["policy"]: p["metrics"] for p in points[: len(sweep)]}
    assert "predictor" in by_policy["sjf"]

    data = {
        "setup": {"describe": setup.describe()},
        "machine": "test",
        "command": "test",
        "wall_seconds": 0.0,
        "capacity": capacity,
        "points": points,
    }
    targets = {row["target"] for row in check_targets(data)}
    assert targets == {1, 2, 4}  # no chat: no sjf/oracle target
    write_report(data, tmp_path / "plots", tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert "### long-prompt" in report and "### Targets" in report
    assert sorted(f.name for f in (tmp_path / "plots").iterdir()) == [
        "policies_goodput.png",
        "policies_latency.png",
    ]


def test_every_workload_spec_builds_and_every_policy_accepts_its_options():
    for specs, policies in ((SIM_WORKLOADS, POLICIES), (REAL_WORKLOADS, POLICIES)):
        for spec in specs.values():
            workload = spec.make(seed=0, rate=1.0, num_requests=40)
            assert all(r.ttft_slo and r.tpot_slo for r in workload.requests)
            for policy in policies:
                if specs is REAL_WORKLOADS and policy in SIM_ONLY:
                    continue
                make_policy(policy, **policy_options(policy, spec))
    # The real engine's workloads fit two CPU cores: short outputs, ~1,000-token long prompts.
    chat = REAL_WORKLOADS["chat"].make(seed=0, rate=1.0, num_requests=200).requests
    assert max(r.output_len for r in chat) <= 128
    longs = [
        r
        for r in REAL_WORKLOADS["long-prompt"].make(seed=0, rate=1.0, num_requests=200).requests
        if r.request_class == "long"
    ]
    assert longs and all(600 <= r.prompt_len <= 1200 for r in longs)


def test_real_mode_plan_runs_and_writes_report_and_plots(tmp_path):
    """The real mode's code path with --predict (a cost model stands in for the CPU model)."""
    parser = argparse.ArgumentParser()
    add_real_arguments(parser)
    output = tmp_path / "real.json"
    args = parser.parse_args(
        ["--predict", "--workloads", "reasoning", "--policies", "fcfs,slo,static",
         "--num-requests", "6", "--output", str(output), "--plots", str(tmp_path / "plots")]
    )  # fmt: skip
    run_real(args)
    data = json.loads(output.read_text())
    assert {c["point"]["policy"] for c in data["capacity"]} == {"fcfs", "static"}
    assert {(p["point"]["policy"], p["point"]["load"]) for p in data["points"]} == {
        ("fcfs", 0.7), ("fcfs", 1.5), ("slo", 0.7), ("slo", 1.5)
    }  # fmt: skip
    assert all(p["metrics"]["overall"]["num_completed"] == 6 for p in data["points"])
    assert "### Targets" in output.with_suffix(".md").read_text()
    assert (tmp_path / "plots" / "policies_latency.png").stat().st_size > 0


def _metrics(num_requests: int, within: int, duration: float) -> dict:
    overall = {"num_requests": num_requests, "num_completed": num_requests,
               "num_within_slo": within, "slo_attainment": within / num_requests,
               "goodput": within / duration}  # fmt: skip
    return {"overall": overall, "offered_window": 8.0, "duration": duration}


def test_the_goodput_bound_bounds_what_target_2_measures():
    """slo drains its requests sooner than fcfs: by each run's own span its goodput is 5x
    fcfs's, more than 1 / fcfs's in-SLO share (2x) allows; over the common window it is 2x."""
    from benchmarks.policy_study.targets import common_window_goodput

    def point(policy: str, metrics: dict) -> dict:
        q = {"workload": "chat", "policy": policy, "load": 1.5, "seed": 0, "tag": ""}
        return {"point": q, "metrics": metrics}

    fcfs, slo = _metrics(10, within=5, duration=10.0), _metrics(10, within=10, duration=4.0)
    assert slo["overall"]["goodput"] / fcfs["overall"]["goodput"] == 5.0
    assert common_window_goodput(slo) / common_window_goodput(fcfs) == 2.0
    rows = check_targets({"capacity": [], "points": [point("fcfs", fcfs), point("slo", slo)]})
    (row,) = [r for r in rows if r["target"] == 2]
    assert row["value"] == "2.00x (bound 2.00x)" and row["met"]
