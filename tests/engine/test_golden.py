"""The golden test: same inputs, same decisions, same times as the recorded reference.

See tests/engine/golden.py for what is recorded and why some fields have a tolerance.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest

from tests.engine import golden


@functools.cache
def reference() -> dict[str, Any]:
    return golden.load_reference()


def _names() -> list[str]:
    return list(reference()["runs"])


def _first_step_difference(expected: list[Any], actual: list[Any]) -> str:
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            return f"step {index}: expected {want!r}\n  got {got!r}"
    return f"{len(expected)} steps expected, {len(actual)} run"


@pytest.mark.parametrize("name", _names())
def test_same_decisions_and_records_as_the_reference(name: str) -> None:
    _check_against_reference(name)


def _prefix_cached_names() -> list[str]:
    return [
        golden.config_name(c)
        for c in reference()["configs"]
        if c.get("enable_prefix_caching", True)
    ]


@pytest.mark.parametrize("name", _prefix_cached_names())
def test_the_builtin_block_hash_makes_the_same_decisions(name: str) -> None:
    """The simulator's cheaper block hash (Python's tuple hash, heddle/core/block_hash.py)
    finds the same prefix hits, so every decision and record is the sha256 reference's."""
    _check_against_reference(name, block_hash="builtin")


def _check_against_reference(name: str, block_hash: str = "sha256") -> None:
    data = reference()
    expected = data["runs"][name]
    configs = {golden.config_name(c): c for c in data["configs"]}
    if name in configs:
        actual = golden.run_one(data["workload"], {**configs[name], "block_hash": block_hash})
    else:
        (spec,) = [
            s
            for s in data["replays"]
            if golden.config_name({k: v for k, v in s.items() if k != "data"}) == name
        ]
        actual = golden.run_replay(spec, spec["data"])
    steps = [list(s) for s in actual["steps"]]
    assert steps == expected["steps"], _first_step_difference(expected["steps"], steps)
    assert [r["request_id"] for r in actual["records"]] == [
        r["request_id"] for r in expected["records"]
    ]
    for want, got in zip(expected["records"], actual["records"], strict=True):
        for field, value in want.items():
            if field in golden.CHARGED_FIELDS:
                assert math.isclose(got[field], value, rel_tol=1e-9, abs_tol=1e-12), (
                    want["request_id"],
                    field,
                )
            else:
                assert got[field] == value, (want["request_id"], field)


def test_the_workload_exercises_every_mechanism() -> None:
    """The reference covers what the rewrite must not change: chunked prefill, preemption,
    prefix hits, n > 1, aborts, length and EOS finishes, every policy."""
    from heddle.core.policies import available_policies

    data = reference()
    runs = data["runs"]
    by_policy = {c["policy"]: runs[golden.config_name(c)] for c in data["configs"][:10]}
    # Policies added after the reference was recorded have their own tests.
    assert set(by_policy) == set(available_policies()) - {"plas"}

    def total(run: dict[str, Any], field: str) -> int:
        return sum(r[field] for r in run["records"])

    assert all(total(run, "num_preemptions") > 0 for p, run in by_policy.items() if p != "static")
    assert all(total(run, "num_cached_tokens") > 0 for run in by_policy.values())
    assert all(
        any(n > 1 and not sample for s in run["steps"] for _, _, n, sample in s[3])
        for run in runs.values()
    )
    records = [r for run in runs.values() for r in run["records"]]
    assert {r["finish_reason"] for r in records} == {"stop", "length", "abort"}
    assert any(r["request_id"].endswith("-2") for r in records)  # n = 3 groups
