"""A small simulated run recorded for the view: two classes, a KV pool small enough to preempt."""

from __future__ import annotations

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.replay import ReplayResult
from heddle.metrics.summary import SLO
from heddle.sim.simulator import build_sim_engine, simulate
from heddle.view.record import ViewRecorder
from heddle.workloads import Workload, WorkloadRequest

SLO_TARGETS = SLO(ttft=0.05, tpot=0.02)


def workload(num_requests: int = 40) -> Workload:
    requests = []
    for i in range(num_requests):
        long = i % 3 == 0
        requests.append(
            WorkloadRequest(
                f"{'batch' if long else 'chat'}-{i}",
                arrival_time=0.004 * i,
                prompt_len=200 if long else 64,
                output_len=80 if long else 24,
                request_class="batch" if long else "chat",
                prompt_seed=i,
            )
        )
    return Workload(name="view-test", params={}, seed=0, requests=requests)


def recorded_run(
    num_requests: int = 40, num_blocks: int = 48, policy: str = "fcfs"
) -> tuple[ReplayResult, ViewRecorder]:
    """Simulate on the Llama-3.1-8B/H100 roofline with the view's probe installed."""
    config = EngineConfig(
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, policy=policy),
    )
    recorder = ViewRecorder("view test run", slo=SLO_TARGETS, info={"test": True})
    engine = build_sim_engine(config, model="llama-3.1-8b", hardware="h100", num_blocks=num_blocks)
    recorder.attach(engine)
    return simulate(workload(num_requests), engine), recorder
