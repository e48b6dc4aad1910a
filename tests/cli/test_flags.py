"""The shared flags: engine flags made from the config fields, one KEY=VALUE parser."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from typing import Literal

import pytest

from heddle.cli.flags import (
    add_config_arguments,
    add_engine_arguments,
    config_from_args,
    engine_config_from_args,
    parse_key_values,
    parse_value,
)
from heddle.cli.main import build_parser
from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.errors import HeddleError


def engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser


def test_every_config_field_is_an_engine_flag_with_the_fields_default():
    args = engine_parser().parse_args([])
    for cls in (ModelConfig, CacheConfig, SchedulerConfig):
        for f in dataclasses.fields(cls):
            assert hasattr(args, f.name), f"{cls.__name__}.{f.name} has no flag"
    assert engine_config_from_args(args) == EngineConfig()


def test_llm_keyword_arguments_are_the_config_fields_too():
    from heddle.engine.llm import build_config

    argv = ["--max-waiting", "3", "--block-size", "32", "--dtype", "float32"]
    config = engine_config_from_args(engine_parser().parse_args(argv))
    flat = {f.name: getattr(sub, f.name) for sub in (config.model, config.cache, config.scheduler)
            for f in dataclasses.fields(sub)}  # fmt: skip
    assert build_config(**flat) == config


def test_engine_flags_keep_their_names_and_help():
    actions = {a.dest: a for a in engine_parser()._actions}
    flags = {dest: a.option_strings[0] for dest, a in actions.items() if a.option_strings}
    assert {flags["policy_options"], flags["enable_prefix_caching"], flags["seed"]} == {
        "--policy-option", "--no-prefix-caching", "--seed"
    }  # fmt: skip
    assert flags["kv_cache_memory_gb"] == "--kv-cache-memory-gb"
    assert actions["max_waiting"].help == (
        "bound on the waiting queue; beyond it requests are refused (HTTP 429)"
    )
    assert actions["num_blocks"].help == "KV blocks (default: from --kv-cache-memory-gb)"


def test_a_field_added_to_a_config_becomes_a_flag():
    """What `quantization` on ModelConfig would get with no edit to the CLI."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Extended:
        quantization: str | None = None
        kind: Literal["a", "b"] = "a"
        scale: float = 1.0
        fast: bool = False
        enable_cache: bool = True
        extra_options: dict[str, object] = dataclasses.field(default_factory=dict)
        layers: tuple[int, ...] = ()
        threshold: int | None = dataclasses.field(default=None, metadata={"help": "a cut-off"})

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Extended)
    assert config_from_args(Extended, parser.parse_args([])) == Extended()
    args = parser.parse_args(
        ["--quantization", "q4_0", "--kind", "b", "--scale", "0.5", "--fast", "--no-cache",
         "--extra-option", "x=null", "--layer", "1", "--layer", "3", "--threshold", "7"]
    )  # fmt: skip
    assert config_from_args(Extended, args) == Extended(
        "q4_0", "b", 0.5, True, False, {"x": None}, (1, 3), 7
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--kind", "c"])
    threshold = next(a for a in parser._actions if a.dest == "threshold")
    assert threshold.help == "a cut-off"


def test_a_field_without_a_command_line_form_fails_loudly():
    @dataclasses.dataclass(frozen=True)
    class Odd:
        nested: set[int] = dataclasses.field(default_factory=set)

    with pytest.raises(TypeError, match="nested"):
        add_config_arguments(argparse.ArgumentParser(), Odd)


def test_one_key_value_parser_for_every_option_flag():
    values = ["n=null", "t=true", "p=None", "x=1.5", "d={'short': 1.0}", "s=fcfs", "l=[1, 2]"]
    expected = {"n": None, "t": True, "p": None, "x": 1.5, "d": {"short": 1.0}, "s": "fcfs",
                "l": [1, 2]}  # fmt: skip
    assert parse_key_values(values) == expected
    assert parse_key_values(["long-share=0.2"]) == {"long_share": 0.2}
    assert parse_value("a=b") == "a=b"
    with pytest.raises(HeddleError, match="--workload-option wants KEY=VALUE, got 'oops'"):
        parse_key_values(["oops"], "--workload-option")
    # The same parser behind --policy-option (serve), --workload-option (simulate, bench).
    serve = build_parser().parse_args(["serve", "--policy-option", "max_preemptions=null"])
    assert engine_config_from_args(serve).scheduler.policy_options == {"max_preemptions": None}


def test_bad_engine_flags_are_clear_errors():
    args = engine_parser().parse_args(["--policy-option", "novalue"])
    with pytest.raises(HeddleError, match="--policy-option wants KEY=VALUE"):
        engine_config_from_args(args)
    with pytest.raises(HeddleError, match="max_num_seqs must be positive"):
        engine_config_from_args(engine_parser().parse_args(["--max-num-seqs", "0"]))


def test_the_shared_flags_import_no_subcommand():
    """No cycle: the flags module pulls in neither the entry point's subcommands nor torch."""
    code = (
        "import sys, heddle.cli.flags; "
        "print(sorted(m for m in ('heddle.server.args', 'heddle.sim.cli', 'heddle.bench.client', "
        "'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
