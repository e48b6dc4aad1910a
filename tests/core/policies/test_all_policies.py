"""Every registered policy runs a random mixed workload to completion: nothing starves, nothing
is lost, and the KV pool is whole afterwards."""

from __future__ import annotations

import pytest

from heddle.core.policies import available_policies, make_policy
from heddle.errors import HeddleError
from tests.core.policies.harness import make_engine, mixed_workload, run

# Options that make each policy's mechanism bite on a small workload.
OPTIONS: dict[str, dict[str, object]] = {
    "priority": {"aging_seconds": 0.2},
    "slo": {"default_ttft": 0.1, "default_tpot": 0.02, "ttft": {"long": 0.5}},
    "sjf": {"aging_seconds": 0.01, "default_output_len": 8},
    "oracle": {"aging_seconds": 0.01},
    "mlfq": {"quantum": 2, "prompt_quantum": 16, "starvation_seconds": 0.3},
    "lanes": {"long_prompt_tokens": 60, "long_output_tokens": 24},
    "adaptive": {"target_tpot": 0.012, "min_token_budget": 4},
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("policy", available_policies())
def test_mixed_workload_runs_to_completion(policy: str, seed: int) -> None:
    engine, executor, clock = make_engine(
        policy,
        num_blocks=48,
        max_num_batched_tokens=32,
        max_num_seqs=6,
        per_token=0.0002,
        **OPTIONS.get(policy, {}),
    )
    arrivals = mixed_workload(seed)
    finished = run(engine, clock, arrivals)
    assert sorted(finished) == sorted(a.request_id for a in arrivals)
    for a in arrivals:
        completions = finished[a.request_id].outputs
        assert len(completions) == a.n
        for completion in completions:
            assert len(completion.token_ids) == a.output_len, (a.request_id, policy)
            assert completion.finish_reason == "stop"
    engine.check_integrity()
    assert executor.checks is not None and executor.checks.num_checked == len(executor.outputs)
    assert engine.kv_cache.num_used_blocks == 0
    assert not engine.scheduler.waiting and not engine.scheduler.running


@pytest.mark.parametrize("policy", available_policies())
def test_unknown_options_are_a_clear_error(policy: str) -> None:
    with pytest.raises(HeddleError, match=f"bad options for policy '{policy}'"):
        make_policy(policy, no_such_option=1)
