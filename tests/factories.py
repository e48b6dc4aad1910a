"""Small factories for scheduler and engine tests: hand-built requests and executor outputs."""

from __future__ import annotations

from heddle.clock import VirtualClock
from heddle.config import EngineConfig, SchedulerConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.core.scheduler import Scheduler
from heddle.request import Request, SamplingParams

EOS = 2


def create_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 32,
    max_num_seqs: int = 8,
    policy: str = "fcfs",
    prefix_caching: bool = True,
    long_prefill_token_threshold: int | None = None,
    max_waiting: int | None = None,
    max_recompute_ratio: float | None = None,
    **policy_options: object,
) -> Scheduler:
    # Without the preemption guard by default: these tests pin the policies' own decisions
    # in runs of a few steps, where any eviction is a large share of the work computed
    # (tests/core/test_preemption_guard.py tests the guard).
    config = SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        policy=policy,
        policy_options=dict(policy_options),
        long_prefill_token_threshold=long_prefill_token_threshold,
        max_waiting=max_waiting,
        max_recompute_ratio=max_recompute_ratio,
    )
    kv = KVCacheManager(num_blocks, block_size, prefix_caching)
    return Scheduler(config, kv, VirtualClock())


def create_request(
    request_id: str,
    prompt_len: int = 8,
    max_tokens: int = 4,
    arrival_time: float = 0.0,
    first_token: int = 100,
    **kwargs: object,
) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(range(first_token, first_token + prompt_len)),
        sampling_params=params,
        arrival_time=arrival_time,
        eos_token_id=EOS,
        **kwargs,  # type: ignore[arg-type]
    )


def scheduled_tokens(scheduler_output: SchedulerOutput) -> dict[str, int]:
    """request id -> tokens it computes in the step, in the scheduler's order."""
    return scheduler_output.scheduled_tokens()


def sample_all(
    scheduler_output: SchedulerOutput, token: int = 7, duration: float = 0.01
) -> ExecutorOutput:
    """An executor output that samples `token` for every request that samples this step."""
    return ExecutorOutput(
        sampled_token_ids=[[token] if s else [] for s in scheduler_output.sample],
        step_duration=duration,
    )


def sampled_by_id(
    scheduler_output: SchedulerOutput, tokens: dict[str, list[int]], duration: float = 0.01
) -> ExecutorOutput:
    """An executor output from `request id -> tokens` (rows not named sample nothing)."""
    return ExecutorOutput(
        sampled_token_ids=[tokens.get(rid, []) for rid in scheduler_output.request_ids],
        step_duration=duration,
    )


class CountingExecutor:
    """A test double for the model: emits token (context length + 3) and EOS at
    true_output_len. Keeps per-request state from the contract, as a real executor does.

    Advances a virtual clock by a fixed step time, as the simulator's executor does.
    """

    def __init__(
        self, clock: VirtualClock, step_time: float = 0.01, vocab_size: int = 1000
    ) -> None:
        self.clock = clock
        self.step_time = step_time
        self.vocab_size = vocab_size
        self.outputs: list[SchedulerOutput] = []
        # request id -> [true output length, eos, output tokens so far]
        self.state: dict[str, list] = {}

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        so = scheduler_output
        self.outputs.append(so)
        for request_id in (*so.finished_request_ids, *so.preempted_request_ids):
            self.state.pop(request_id, None)
        for new in so.new_requests:
            self.state[new.request_id] = [new.true_output_len, new.eos_token_id,
                                          new.num_output_tokens]  # fmt: skip
        self.clock.advance(self.step_time)
        sampled: list[list[int]] = []
        for request_id, start, num_new, sample in zip(
            so.request_ids, so.num_computed_tokens, so.num_new_tokens, so.sample, strict=True
        ):
            if not sample:
                sampled.append([])
                continue
            state = self.state[request_id]
            true_len, eos, num_output = state
            state[2] += 1
            if true_len is not None and num_output + 1 >= true_len:
                sampled.append([eos if eos is not None else EOS])
            else:
                sampled.append([3 + ((start + num_new) % (self.vocab_size - 3))])
        return ExecutorOutput(sampled_token_ids=sampled, step_duration=self.step_time)


def engine_config(**scheduler: object) -> EngineConfig:
    from heddle.config import CacheConfig

    block_size = int(scheduler.pop("block_size", 4))  # type: ignore[call-overload]
    return EngineConfig(
        cache=CacheConfig(block_size=block_size),
        scheduler=SchedulerConfig(**scheduler),  # type: ignore[arg-type]
    )
