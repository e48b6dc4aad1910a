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
