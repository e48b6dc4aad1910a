"""A CI-sized subset of benchmarks/structured_suite.py (the full run is in docs/BENCHMARKS.md):
forced tool calls and json_schema outputs of the embedded model validate, every one."""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest

from tests.server.live import LiveServer, real_engine

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SUBSET = ["order", "refs", "any_of", "enum_array", "pattern"]


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import structured_suite
    finally:
        sys.path.remove(str(BENCHMARKS))
    return structured_suite


@pytest.fixture(scope="module")
def client():
    live = LiveServer(real_engine(max_model_len=2048, max_num_seqs=16)).start()
    yield openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="none", max_retries=0)
    live.assert_pool_whole()
    live.stop()


def test_subset_of_the_schema_suite_is_all_valid(suite, client):
    modes = list(suite.TARGET_MODES)
    cases = suite.run_suite(client, "SmolLM2-135M-Instruct", SUBSET, modes, [0],
                            max_tokens=200, concurrency=8)
    assert len(cases) == len(SUBSET) * len(modes)
    invalid = [(c.schema, c.mode, c.reason, c.text) for c in cases if not c.valid]
    assert invalid == []
