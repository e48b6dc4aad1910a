"""Multi-step scenarios for policy tests: an Engine on a virtual clock, requests arriving over
time, and an executor whose step time grows with the tokens in the step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from heddle.clock import VirtualClock
from heddle.core.outputs import ExecutorOutput, SchedulerOutput
from heddle.core.policies import SchedulerView, StepLimits
from heddle.engine.engine import Engine
from heddle.request import Request, SamplingParams
from tests.factories import CountingExecutor, engine_config, scheduled_tokens


class StepChecks:
    """Checks every step against the limits the policy set for it: the token budget (and each
    lane's), the seat cap (no admission beyond it) and the configured maxima."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.policy = engine.scheduler.policy
        self._step_limits = self.policy.step_limits
        self.policy.step_limits = self._capture  # type: ignore[method-assign]
        self.limits: StepLimits | None = None
        self.num_running_before = 0
        self.requests: dict[str, Request] = {}
        self.num_checked = 0

    def _capture(self, view: SchedulerView) -> StepLimits:
        limits = self._step_limits(view)
        self.limits = limits
        self.num_running_before = len(view.running)
        self.requests = {r.request_id: r for r in (*view.running, *view.waiting)}
        return limits

    def check(self, scheduler_output: SchedulerOutput) -> None:
        """Called when the step is scheduled, before it runs."""
        limits, config = self.limits, self.engine.config.scheduler
        assert limits is not None
        assert limits.token_budget <= config.max_num_batched_tokens
        assert limits.max_num_seqs <= config.max_num_seqs
        tokens = scheduled_tokens(scheduler_output)
        assert sum(tokens.values()) <= limits.token_budget, (tokens, limits)
        if config.long_prefill_token_threshold is not None:
            assert max(tokens.values(), default=0) <= config.long_prefill_token_threshold
        for lane, budget in limits.lane_budgets.items():
            used = sum(
                n for rid, n in tokens.items() if self.policy.lane_of(self.requests[rid]) == lane
            )
            assert used <= budget, (lane, used, budget)
        running = len(self.engine.scheduler.running)
        assert running <= max(limits.max_num_seqs, self.num_running_before), (running, limits)
        self.num_checked += 1


class TimedExecutor(CountingExecutor):
    """CountingExecutor whose step lasts base + per_token * scheduled tokens."""

    def __init__(self, clock: VirtualClock, base: float = 0.01, per_token: float = 0.0) -> None:
        super().__init__(clock, step_time=base)
        self.per_token = per_token
        self.checks: StepChecks | None = None

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        if self.checks is not None:
            self.checks.check(scheduler_output)
        output = super().execute(scheduler_output)
        extra = self.per_token * scheduler_output.num_scheduled_tokens
        self.clock.advance(extra)
        output.step_duration += extra
        return output


@dataclass
class Arrival:
    request_id: str
    time: float
    prompt_len: int
    output_len: int
    n: int = 1
    fields: dict[str, object] = field(default_factory=dict)


def make_engine(
    policy: str,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 32,
    max_num_seqs: int = 8,
    per_token: float = 0.0,
    **policy_options: object,
) -> tuple[Engine, TimedExecutor, VirtualClock]:
    clock = VirtualClock()
    executor = TimedExecutor(clock, per_token=per_token)
    config = engine_config(
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        policy=policy,
        policy_options=policy_options,
    )
    engine = Engine(config, executor, num_blocks=num_blocks, clock=clock, eos_token_id=2)
    executor.checks = StepChecks(engine)
    return engine, executor, clock


def run(engine: Engine, clock: VirtualClock, arrivals: list[Arrival], max_steps: int = 20_000):
    """Add each request when the clock reaches its arrival; step until all have finished."""
    pending = sorted(arrivals, key=lambda a: a.time)
    finished = {}
    for _ in range(max_steps):
        while pending and pending[0].time <= clock.now():
            a = pending.pop(0)
            engine.add_request(
                a.request_id,
                [10 + (i * 7 + len(a.request_id)) % 900 for i in range(a.prompt_len)],
                SamplingParams(n=a.n, max_tokens=a.output_len + 10),
                arrival_time=a.time,
                true_output_len=a.output_len,
                **a.fields,  # type: ignore[arg-type]
            )
        if not engine.has_unfinished_requests():
            if not pending:
                return finished
            clock.advance_to(pending[0].time)
            continue
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        engine.check_integrity()  # every step, not only at the end
    raise AssertionError(f"not done after {max_steps} steps")


def mixed_workload(seed: int, num_requests: int = 40) -> list[Arrival]:
    """Short and long prompts and outputs, several users, priorities, classes and SLOs."""
    rng = random.Random(seed)
    arrivals = []
    t = 0.0
    for i in range(num_requests):
        t += rng.expovariate(1 / 0.02)
        long_prompt = rng.random() < 0.2
        arrivals.append(
            Arrival(
                request_id=f"r{i}",
                time=round(t, 4),
                prompt_len=rng.randint(60, 120) if long_prompt else rng.randint(1, 24),
                output_len=rng.choice([1, 2, rng.randint(3, 12), rng.randint(20, 60)]),
                n=2 if rng.random() < 0.1 else 1,
                fields={
                    "user": rng.choice(["ann", "bob", "cy", None]),
                    "priority": rng.randint(0, 2),
                    "request_class": "long" if long_prompt else "short",
                    "ttft_slo": rng.choice([None, 0.05, 0.5]),
                    "tpot_slo": rng.choice([None, 0.02, 0.1]),
                    "output_len_hint": rng.choice([None, None, rng.randint(1, 40)]),
                },
            )
        )
    return arrivals
