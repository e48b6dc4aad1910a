"""The golden run: a fixed mixed workload through the simulator, every policy, recorded.

The reference (`golden_reference.json.gz`, next to this file) was recorded from the code
before the lean-step rewrite (issue 9). `tests/engine/test_golden.py` replays the same inputs
and asserts the same decisions: the sequence of batch compositions step by step (which
requests, how many tokens from which position, who samples, who was preempted or finished)
and every request's record.

What must stay bit-identical: every decision, and every time on the virtual clock (step
starts and durations, arrival, first scheduled, first token, each token's time, finish).
Charged durations (stall time, time blocked by longer requests, the step-utilization sum)
are sums of many floats whose order of summation a rewrite may change: compared to 1e-9.
The workload does not depend on the simulated token VALUES (no stop strings, no prompts built
from outputs): a simulated token only matters through EOS at the request's true length.

Regenerate (only when a decision is meant to change, and say so in the commit):

    /work/tools/py -m tests.engine.golden --write
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path
from typing import Any

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.roofline import RooflineCostModel

REFERENCE = Path(__file__).with_name("golden_reference.json.gz")
EOS = 2
VOCAB = 32000
BLOCK_SIZE = 16
# NO_GUARD: the reference predates the preemption guard (issue 16), which changes who is
# preempted once preemption has thrown away a tenth of the work; the golden runs are the
# scheduler's decisions without it (tests/core/test_preemption_guard.py tests the guard).
# Records' fields that are sums of charged durations (compared with a tolerance).
CHARGED_FIELDS = ("stall_time", "blocked_by_longer_time", "step_utilization_sum")

# Options that make each policy's mechanism bite on this workload (step times of a few ms).
POLICY_OPTIONS: dict[str, dict[str, Any]] = {
    "adaptive": {"target_tpot": 0.0075, "min_token_budget": 8},
    "fair": {},
    "fcfs": {},
    "lanes": {"long_prompt_tokens": 160, "long_output_tokens": 40},
    "mlfq": {"quantum": 4, "prompt_quantum": 64, "starvation_seconds": 0.4},
    "oracle": {"aging_seconds": 0.05},
    "priority": {"aging_seconds": 0.3},
    "sjf": {"aging_seconds": 0.05, "default_output_len": 12},
    "slo": {"default_ttft": 0.15, "default_tpot": 0.012, "ttft": {"long": 0.6}},
    "static": {},
}


def make_workload(seed: int = 9, num_requests: int = 56) -> dict[str, Any]:
    """Arrivals, prompts (shared system prompts, so the prefix cache hits), n > 1, lengths."""
    rng = random.Random(seed)
    requests = []
    t = 0.0
    for i in range(num_requests):
        t += rng.expovariate(1 / 0.012)
        long_prompt = rng.random() < 0.2
        requests.append(
            {
                "id": f"g{i}",
                "time": round(t, 5),
                "family": rng.choice([None, 0, 0, 1, 2]),  # shared system prompt, or none
                "family_len": rng.choice([16, 40, 64]),
                "prompt_len": rng.randint(150, 330) if long_prompt else rng.randint(3, 60),
                "output_len": rng.choice([1, 2, rng.randint(3, 16), rng.randint(20, 70)]),
                "extra_tokens": rng.choice([0, 0, 0, 5, -1]),  # max_tokens = output + this
                "min_tokens": rng.choice([0, 0, 0, 0, 3]),
                "n": rng.choice([1, 1, 1, 1, 1, 2, 3]),
                "user": rng.choice(["ann", "bob", "cy", None]),
                "priority": rng.randint(0, 2),
                "request_class": "long" if long_prompt else "short",
                "ttft_slo": rng.choice([None, 0.05, 0.4]),
                "tpot_slo": rng.choice([None, 0.01, 0.05]),
                "output_len_hint": rng.choice([None, None, rng.randint(1, 40)]),
            }
        )
    aborts = [
        {"id": requests[7]["id"], "time": requests[7]["time"] + 0.03},
        {"id": requests[30]["id"], "time": requests[30]["time"] + 0.002},
    ]
    return {"requests": requests, "aborts": aborts}


def prompt_ids(spec: dict[str, Any]) -> list[int]:
    """A family's system prompt (shared across requests), then tokens of this request only."""
    own = [100 + (7 * i + 13 * int(spec["id"][1:])) % 30000 for i in range(spec["prompt_len"])]
    if spec["family"] is None:
        return own
    shared = [200 + 1000 * spec["family"] + i for i in range(spec["family_len"])]
    return shared + own


CONFIGS: list[dict[str, Any]] = [
    *({"policy": p, "num_blocks": 44} for p in sorted(POLICY_OPTIONS)),
    {"policy": "fcfs", "num_blocks": 44, "long_prefill_token_threshold": 24},
    {"policy": "fcfs", "num_blocks": 44, "enable_prefix_caching": False},
    {"policy": "fcfs", "num_blocks": 30, "max_num_seqs": 16},
    {"policy": "priority", "num_blocks": 30, "max_num_batched_tokens": 40},
]


def config_name(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


class RecordingExecutor:
    """Wraps the simulated executor and writes down each step's batch composition."""

    def __init__(self, inner: SimulatedExecutor, clock: VirtualClock) -> None:
        self.inner = inner
        self.clock = clock
        self.steps: list[list[Any]] = []

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        start = self.clock.now()
        output = self.inner.execute(scheduler_output)
        self.steps.append(
            [
                scheduler_output.step_id,
                start,
                output.step_duration,
                batch_composition(scheduler_output),
                sorted(scheduler_output.preempted_request_ids),
                sorted(scheduler_output.finished_request_ids),
            ]
        )
        return output


def batch_composition(scheduler_output: SchedulerOutput) -> list[list[Any]]:
    """[request id, tokens computed before the step, tokens this step, samples?] per request,
    in the order the scheduler chose."""
    return [list(row) for row in scheduler_output.rows()]


def record_fields(record: Any) -> dict[str, Any]:
    return {
        "request_id": record.request_id,
        "arrival_time": record.arrival_time,
        "num_prompt_tokens": record.num_prompt_tokens,
        "first_scheduled_time": record.first_scheduled_time,
        "first_token_time": record.first_token_time,
        "token_times": list(record.token_times),
        "finish_time": record.finish_time,
        "finish_reason": record.finish_reason,
        "num_preemptions": record.num_preemptions,
        "num_cached_tokens": record.num_cached_tokens,
        "num_steps": record.num_steps,
        "stall_time": record.stall_time,
        "blocked_by_longer_time": record.blocked_by_longer_time,
        "step_utilization_sum": record.step_utilization_sum,
    }


def run_one(workload: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    policy = config["policy"]
    engine_config = EngineConfig(
        cache=CacheConfig(
            block_size=BLOCK_SIZE,
            enable_prefix_caching=config.get("enable_prefix_caching", True),
            block_hash=config.get("block_hash", "sha256"),
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=config.get("max_num_batched_tokens", 64),
            max_num_seqs=config.get("max_num_seqs", 8),
            policy=policy,
            policy_options=POLICY_OPTIONS[policy],
            long_prefill_token_threshold=config.get("long_prefill_token_threshold"),
            max_recompute_ratio=None,  # see NO_GUARD
        ),
    )
    clock = VirtualClock()
    cost = RooflineCostModel("llama-3.1-8b", "h100")
    executor = RecordingExecutor(SimulatedExecutor(cost, clock, vocab_size=VOCAB, seed=3), clock)
    engine = Engine(
        engine_config,
        executor,
        num_blocks=config["num_blocks"],
        clock=clock,
        eos_token_id=EOS,
        vocab_size=VOCAB,
        max_model_len=1024,
    )
    pending = sorted(
        [("add", r["time"], i, r) for i, r in enumerate(workload["requests"])]
        + [("abort", a["time"], 10_000 + i, a) for i, a in enumerate(workload["aborts"])],
        key=lambda e: (e[1], e[2]),
    )
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1] <= clock.now():
            kind, t, _, spec = pending.pop(0)
            if kind == "abort":
                engine.abort_request(spec["id"])
                continue
            max_tokens = spec["output_len"] + spec["extra_tokens"]
            engine.add_request(
                spec["id"],
                prompt_ids(spec),
                SamplingParams(
                    n=spec["n"],
                    max_tokens=max(1, max_tokens),
                    min_tokens=spec["min_tokens"],
                    seed=7,
                ),
                arrival_time=t,
                priority=spec["priority"],
                user=spec["user"],
                request_class=spec["request_class"],
                ttft_slo=spec["ttft_slo"],
                tpot_slo=spec["tpot_slo"],
                output_len_hint=spec["output_len_hint"],
                true_output_len=spec["output_len"],
            )
        if not engine.has_unfinished_requests():
            if pending:
                clock.wait_until(pending[0][1])
            continue
        before = engine.num_steps
        engine.step()
        if engine.num_steps == before:
            if not pending:
                raise RuntimeError(f"{config_name(config)}: stuck with nothing pending")
            clock.wait_until(pending[0][1])
    engine.check_integrity()
    records = sorted(engine.finished_records, key=lambda r: r.request_id)
    return {"steps": executor.steps, "records": [record_fields(r) for r in records]}


# Named workloads through `simulate()` (the replay event loop `heddle simulate` uses). The agent
# workload's later prompts contain earlier outputs: only their equality matters (prefix hits).
REPLAYS: list[dict[str, Any]] = [
    {"workload": "chat", "num_requests": 40, "rate": 60.0, "policy": "fcfs", "num_blocks": 64},
    {"workload": "agent", "num_requests": 8, "rate": 8.0, "policy": "sjf", "num_blocks": 80},
]


# The replays run each policy with its defaults as they were when the reference was recorded:
# sjf's aging default moved from 0.1 to 0.01 s a token (issue 16, the pass-over bound), a
# change of policy, not of the mechanism these runs pin down.
REPLAY_POLICY_OPTIONS: dict[str, dict[str, Any]] = {"sjf": {"aging_seconds": 0.1}}


def replay_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """The named workload as plain data (stored in the reference, so that a later change to a
    generator does not change the golden inputs)."""
    from dataclasses import asdict

    from heddle.workloads import get_workload

    workload = get_workload(
        spec["workload"],
        seed=1,
        num_requests=spec["num_requests"],
        rate=spec["rate"],
        length_scale=0.3,
    )
    return {
        "name": workload.name,
        "requests": [r.to_dict() for r in workload.requests],
        "programs": [asdict(p) for p in workload.programs],
    }


def build_workload(data: dict[str, Any]) -> Any:
    from heddle.workloads import AgentCall, AgentProgram, Workload, WorkloadRequest

    programs = [
        AgentProgram(**{**p, "calls": tuple(AgentCall(**c) for c in p["calls"])})
        for p in data["programs"]
    ]
    requests = [WorkloadRequest.from_dict(r) for r in data["requests"]]
    return Workload(data["name"], {}, 1, requests, programs)


def run_replay(spec: dict[str, Any], workload_data: dict[str, Any]) -> dict[str, Any]:
    from heddle.sim.simulator import sim_engine, simulate

    workload = build_workload(workload_data)
    config = EngineConfig(
        cache=CacheConfig(block_size=BLOCK_SIZE),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=256,
            max_num_seqs=16,
            policy=spec["policy"],
            policy_options=REPLAY_POLICY_OPTIONS.get(spec["policy"], {}),
            max_recompute_ratio=None,  # see NO_GUARD
        ),
    )
    cost = RooflineCostModel("llama-3.1-8b", "h100")
    holder: dict[str, RecordingExecutor] = {}

    def factory(clock: VirtualClock) -> RecordingExecutor:
        holder["executor"] = RecordingExecutor(
            SimulatedExecutor(cost, clock, vocab_size=VOCAB, seed=1), clock
        )
        return holder["executor"]

    engine = sim_engine(config, factory, num_blocks=spec["num_blocks"], vocab_size=VOCAB)
    result = simulate(workload, engine)
    records = sorted(result.records, key=lambda r: r.request_id)
    return {"steps": holder["executor"].steps, "records": [record_fields(r) for r in records]}


def record_all() -> dict[str, Any]:
    workload = make_workload()
    replays = [dict(spec, data=replay_workload(spec)) for spec in REPLAYS]
    return {
        "workload": workload,
        "configs": CONFIGS,
        "replays": replays,
        "runs": run_all(workload, CONFIGS, replays),
    }


def run_all(
    workload: dict[str, Any], configs: list[dict[str, Any]], replays: list[dict[str, Any]]
) -> dict[str, Any]:
    runs = {config_name(c): run_one(workload, c) for c in configs}
    for spec in replays:
        name = config_name({k: v for k, v in spec.items() if k != "data"})
        runs[name] = run_replay(spec, spec["data"])
    return runs


# -- a compact encoding of a run (the reference file stays small) -----------------------------
# Steps: a step's start is stored only when it is not the previous step's end; a request's
# position only when it is not where its previous step left it. Token times are stored as runs
# of step indices (every token time is the end of the step that sampled it).


def encode_run(run: dict[str, Any]) -> dict[str, Any]:
    steps_out = []
    next_start: dict[str, int] = {}
    prev_end = None
    ends: dict[float, int] = {}
    for index, (step_id, start, duration, batch, preempted, finished) in enumerate(run["steps"]):
        entries = []
        for rid, position, num, sample in batch:
            expected = next_start.get(rid, 0)
            entries.append([rid, None if position == expected else position, num, int(sample)])
            next_start[rid] = position + num
        for rid in preempted:
            next_start[rid] = 0
        steps_out.append(
            [step_id, None if start == prev_end else start, duration, entries, preempted, finished]
        )
        prev_end = start + duration
        ends[prev_end] = index
    records_out = []
    for record in run["records"]:
        encoded = dict(record)
        runs: list[list[int]] = []
        for t in record["token_times"]:
            index = ends[t]
            if runs and runs[-1][0] + runs[-1][1] == index:
                runs[-1][1] += 1
            else:
                runs.append([index, 1])
        encoded["token_times"] = runs
        records_out.append(encoded)
    return {"steps": steps_out, "records": records_out}


def decode_run(encoded: dict[str, Any]) -> dict[str, Any]:
    steps = []
    next_start: dict[str, int] = {}
    ends: list[float] = []
    prev_end = 0.0
    for step_id, start, duration, entries, preempted, finished in encoded["steps"]:
        start = prev_end if start is None else start
        batch = []
        for rid, position, num, sample in entries:
            position = next_start.get(rid, 0) if position is None else position
            batch.append([rid, position, num, bool(sample)])
            next_start[rid] = position + num
        for rid in preempted:
            next_start[rid] = 0
        steps.append([step_id, start, duration, batch, preempted, finished])
        prev_end = start + duration
        ends.append(prev_end)
    records = []
    for record in encoded["records"]:
        decoded = dict(record)
        decoded["token_times"] = [
            ends[first + i] for first, count in record["token_times"] for i in range(count)
        ]
        records.append(decoded)
    return {"steps": steps, "records": records}


def load_reference() -> dict[str, Any]:
    with gzip.open(REFERENCE, "rt") as f:
        data = json.load(f)
    data["runs"] = {name: decode_run(run) for name, run in data["runs"].items()}
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description="record the golden run")
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE.name}")
    args = parser.parse_args()
    data = record_all()
    for name, run in data["runs"].items():
        steps = run["steps"]
        records = run["records"]
        print(
            f"{name}: {len(steps)} steps, {len(records)} records, "
            f"{sum(r['num_preemptions'] for r in records)} preemptions, "
            f"{sum(r['num_cached_tokens'] for r in records)} cached tokens, "
            f"{sum(1 for s in steps for b in s[3] if b[2] > 1 and not b[3])} partial chunks, "
            f"{sum(1 for r in records if r['finish_reason'] == 'length')} length, "
            f"{sum(1 for r in records if r['finish_reason'] == 'abort')} aborted"
        )
    if args.write:
        encoded = dict(data, runs={name: encode_run(run) for name, run in data["runs"].items()})
        for name, run in data["runs"].items():
            assert decode_run(encoded["runs"][name]) == run, f"{name}: the encoding loses data"
        # mtime=0: the same run writes the same bytes.
        with REFERENCE.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(encoded, separators=(",", ":")).encode())
        print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
