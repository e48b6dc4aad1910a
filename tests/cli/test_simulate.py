"""`heddle simulate` end to end through the command line (small runs, no torch needed)."""

from __future__ import annotations

import json

from heddle.cli.main import build_parser, main


def test_simulate_runs_and_writes_its_outputs(tmp_path, capsys):
    code = main(
        ["simulate", "--workload", "chat", "--num-requests", "20", "--rate", "50",
         "--workload-option", "length_scale=0.1", "--policy", "priority",
         "--policy-option", "aging_seconds=0.5", "--max-num-seqs", "8",
         "--output-dir", str(tmp_path), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "20 requests, 0 rejected" in out
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert len(data["records"]) == 20
    assert data["config"]["policy_options"] == ["aging_seconds=0.5"]


def test_simulate_defaults_are_gpu_sized():
    args = build_parser().parse_args(["simulate"])
    assert (args.max_num_batched_tokens, args.max_num_seqs, args.num_blocks) == (8192, 256, None)
    assert args.max_waiting is None and not hasattr(args, "kv_cache_memory_gb")


def test_simulate_errors_are_one_line(capsys):
    assert main(["simulate", "--cost-model", "no/such/profile.json"]) == 2
    error = capsys.readouterr().err
    assert error == "heddle: error: no cost model file at no/such/profile.json\n"
    assert main(["simulate", "--workload-option", "oops", "--num-requests", "2"]) == 2
    assert "--workload-option wants KEY=VALUE" in capsys.readouterr().err


def test_simulated_speculation_accepts_at_the_given_rate(capsys):
    """`--speculation method=sim` takes its acceptance rate from the flags (it used to reject
    every draft): more accepted drafts, fewer steps for the same outputs."""
    steps = {}
    for acceptance in (0.0, 0.8):
        code = main(
            ["simulate", "--workload", "chat", "--num-requests", "8", "--rate", "50",
             "--workload-option", "length_scale=0.1", "--max-num-seqs", "8", "--no-progress",
             "--speculation", "method=sim", "--speculation", f"acceptance={acceptance}",
             "--speculation", "acceptance_spread=0", "--speculation", "adaptive=false"]
        )  # fmt: skip
        assert code == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("speculation:"))
        drafted, accepted = int(line.split()[1]), int(line.split()[4])
        assert drafted > 0
        if acceptance == 0.0:
            assert accepted == 0
        else:
            # Four drafts a step, each accepted at 0.8 given the ones before: 0.59 of them.
            assert 0.5 < accepted / drafted < 0.68
        steps[acceptance] = int(next(x for x in out.splitlines() if " steps, " in x)
                                .split(" steps, ")[0].split()[-1])
    assert steps[0.8] < 0.6 * steps[0.0]


def test_a_subcommand_imports_only_its_own_module() -> None:
    """`heddle simulate` / `heddle policies` do not import the server (seconds at start)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from heddle.cli.main import main\n"
        "assert main(['policies']) == 0\n"
        "print('heddle.server.args' in sys.modules, 'fastapi' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_decision_events_are_on_only_where_something_reads_them(tmp_path):
    """A run that only prints its summary records no decision events (nothing reads them, and
    they cost every step); one that writes the view's recording has them at the ring's default
    size; an explicit --decision-events wins either way."""
    from heddle.config import SchedulerConfig
    from heddle.sim.cli import build_once

    def ring(*flags: str) -> int | None:
        args = build_parser().parse_args(["simulate", "--num-requests", "2", *flags])
        _, engine = build_once(args, None)
        events = engine.scheduler.events
        return None if events is None else events.capacity

    assert ring() is None
    assert ring("--output-dir", str(tmp_path)) == SchedulerConfig().decision_events
    assert ring("--decision-events", "1000") == 1000
    assert ring("--output-dir", str(tmp_path), "--decision-events", "0") is None
