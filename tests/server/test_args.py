"""`heddle serve` options -> EngineConfig and server settings."""

from __future__ import annotations

import argparse

import pytest

from heddle.cli.flags import parse_key_values
from heddle.errors import HeddleError
from heddle.server.args import add_arguments, engine_config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_bind_localhost_with_no_key():
    args = parse()
    assert (args.host, args.port, args.api_key, args.max_waiting) == ("127.0.0.1", 8000, None, None)


def test_options_reach_the_engine_config():
    args = parse(
        "--model", "m.gguf", "--policy", "priority", "--policy-option", "aging=0.5",
        "--max-waiting", "8", "--max-num-seqs", "32", "--block-size", "32",
        "--no-prefix-caching", "--max-model-len", "2048",
    )  # fmt: skip
    config = engine_config_from_args(args)
    assert config.model.model == "m.gguf" and config.model.max_model_len == 2048
    assert config.scheduler.policy == "priority"
    assert config.scheduler.policy_options == {"aging": 0.5}
    assert (config.scheduler.max_waiting, config.scheduler.max_num_seqs) == (8, 32)
    assert config.cache.block_size == 32 and not config.cache.enable_prefix_caching


def test_policy_options_parse_literals_or_keep_strings():
    assert parse_key_values(["a=1", "b=x", "c=[1, 2]"]) == {"a": 1, "b": "x", "c": [1, 2]}
    with pytest.raises(HeddleError, match="--policy-option wants KEY=VALUE"):
        parse_key_values(["novalue"], "--policy-option")
