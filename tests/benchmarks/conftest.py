"""The benchmark scripts import each other by bare module name (they run from benchmarks/):
`benchmarks_on_path` puts that folder on sys.path for a test module that imports them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def benchmarks_on_path():
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))
