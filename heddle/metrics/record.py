"""One record per request: every report is computed from these."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """Timing of one request, in the engine clock's seconds (wall or virtual)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    request_class: str = "default"
    user: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finish_time: float | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    # Time the request was ready to run (arrived, not finished) but not in a step.
    stall_time: float = 0.0
    # The part of stall_time spent while a longer request (more context) ran in its place.
    blocked_by_longer_time: float = 0.0
    num_steps: int = 0  # steps the request took part in
    # Sum over those steps of (tokens the step computed / its token budget): lock-step waste
    # shows as steps that ran far below their budget.
    step_utilization_sum: float = 0.0
    # Per-request SLO targets (seconds); they override a report's global SLO.
    ttft_slo: float | None = None
    tpot_slo: float | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def step_utilization(self) -> float | None:
        """Mean utilization of the steps the request took part in."""
        return self.step_utilization_sum / self.num_steps if self.num_steps else None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies."""
        return [b - a for a, b in itertools.pairwise(self.token_times)]
