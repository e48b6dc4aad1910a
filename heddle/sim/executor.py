"""SimulatedExecutor: a cost model on a virtual clock in place of a forward pass.

The engine and scheduler are the real ones; only this executor and the clock differ. Each
step advances the clock by the cost model's prediction, so the engine sees time pass as with
a real executor, and samples one token per sampling request: the request's EOS at its true
output length, otherwise a deterministic ordinary token.
"""

from __future__ import annotations

import zlib

from heddle.clock import VirtualClock
from heddle.core.outputs import ExecutorOutput, ScheduledRequest, SchedulerOutput
from heddle.sim.cost_model import CostModel, StepShape

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a cheap, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class SimulatedExecutor:
    """Implements the `Executor` protocol with a cost model; keeps no per-request state."""

    def __init__(
        self, cost_model: CostModel, clock: VirtualClock, vocab_size: int = 32000, seed: int = 0
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        self.cost_model = cost_model
        self.clock = clock
        self.vocab_size = vocab_size
        self.seed = seed

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        """Advance the clock by the step's predicted time and sample one token per sampler.

        An empty step takes no time: nothing runs on the device.
        """
        duration = 0.0
        if not scheduler_output.is_empty:
            duration = self.cost_model.step_time(StepShape.from_scheduler_output(scheduler_output))
            self.clock.advance(duration)
        sampled = {
            s.request_id: [self.next_token(s)] for s in scheduler_output.scheduled if s.sample
        }
        return ExecutorOutput(sampled_token_ids=sampled, step_duration=duration)

    def next_token(self, scheduled: ScheduledRequest) -> int:
        """EOS once the request reaches its `true_output_len`, else a token that is neither
        EOS nor a stop token, hashed from (seed, request id, output index).

        At or past the true length (min_tokens can hold EOS back) it keeps answering EOS, as a
        model that wants to stop would.
        """
        index = scheduled.num_output_tokens
        if (
            scheduled.true_output_len is not None
            and scheduled.eos_token_id is not None
            and index + 1 >= scheduled.true_output_len
        ):
            return scheduled.eos_token_id
        stop_ids = scheduled.sampling_params.stop_token_ids
        eos = scheduled.eos_token_id
        request_hash = zlib.crc32(scheduled.request_id.encode())
        state = _mix64((self.seed << 32) ^ request_hash) ^ index
        # One hash per token on the hot path; redraw only on the rare hit of a stopping id.
        for _ in range(64):
            state = _mix64(state)
            token = state % self.vocab_size
            if token != eos and token not in stop_ids:
                return token
        avoid = {*stop_ids, eos}
        if sum(1 for t in avoid if t is not None and 0 <= t < self.vocab_size) == self.vocab_size:
            raise ValueError(
                f"every token of the {self.vocab_size}-token vocabulary stops request "
                f"{scheduled.request_id}"
            )
        while True:
            state = _mix64(state)
            token = state % self.vocab_size
            if token not in avoid:
                return token
