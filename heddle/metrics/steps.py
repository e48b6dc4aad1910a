"""One record per engine step: what ran, how long it took, and how full the KV cache was."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StepStat:
    step_id: int
    start_time: float
    duration: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    # The requests in the step, in order: kept only when the engine is asked to
    # (record_step_requests), as they cost memory per request per step.
    request_ids: list[str] = field(default_factory=list)
    token_budget: int = 0
    num_requests: int = 0  # requests in the step (len(request_ids) when those are kept)

    def __post_init__(self) -> None:
        if not self.num_requests:
            self.num_requests = len(self.request_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def utilization(self) -> float:
        """Tokens computed / token budget."""
        return self.num_tokens / self.token_budget if self.token_budget else 0.0
