"""`heddle serve --replicas`: bad options fail in one line, before Ray starts."""

from __future__ import annotations

import sys

import pytest

from heddle.cli import main


def test_bad_replica_options_fail_before_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "2", "--router", "nope"]) == 2
    assert "unknown router 'nope'" in capsys.readouterr().err
    assert main(["serve", "--replicas", "0"]) == 2
    assert "--replicas must be at least 1" in capsys.readouterr().err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
