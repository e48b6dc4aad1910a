"""The utilization/latency knob: batch size and token budget adapt to hold a target TPOT.

Every running request gets one token per step, so a step's duration is the TPOT of everyone
in it. After each step: slower than `target_tpot` -> multiplicative decrease to
`decrease_factor` times what the step used (of tokens; of seats too when decodes made up most of
the step, since a slow prefill is cured by the token budget alone); otherwise additive increase
(`increase_seqs`, `increase_tokens`). Caps stay within [`min_num_seqs`, configured
max_num_seqs] and [`min_token_budget`, configured budget]; the token budget never drops below
the seat cap nor below the running count, so every seated request can still decode. Shrinking
the seat cap preempts no one: it stops admission until the batch has drained below it.
Order is FCFS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import register

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput


@register
class AdaptivePolicy(Policy):
    """AIMD on max_num_seqs and the token budget against a target step time (TPOT)."""

    name = "adaptive"
    waiting_order_changes = False  # arrival order
    running_order_changes = False

    def __init__(
        self,
        target_tpot: float = 0.05,
        min_num_seqs: int = 1,
        min_token_budget: int = 16,
        increase_seqs: int = 1,
        increase_tokens: int = 32,
        decrease_factor: float = 0.75,
    ) -> None:
        super().__init__()
        if target_tpot <= 0:
            raise ValueError(f"target_tpot must be positive, got {target_tpot}")
        if min_num_seqs < 1 or min_token_budget < 1:
            raise ValueError("min_num_seqs and min_token_budget must be positive")
        if increase_seqs < 0 or increase_tokens < 0:
            raise ValueError("increase_seqs and increase_tokens must be >= 0")
        if not 0 < decrease_factor < 1:
            raise ValueError(f"decrease_factor must be in (0, 1), got {decrease_factor}")
        self.target_tpot = float(target_tpot)
        self.min_num_seqs = min_num_seqs
        self.min_token_budget = min_token_budget
        self.increase_seqs = increase_seqs
        self.increase_tokens = increase_tokens
        self.decrease_factor = float(decrease_factor)
        # None until the first step shows the configured limits.
        self.max_num_seqs: int | None = None
        self.token_budget: int | None = None
        self._configured = (0, 0)  # (max_num_seqs, token_budget) of the scheduler

    def step_limits(self, view: SchedulerView) -> StepLimits:
        self._configured = (view.max_num_seqs, view.token_budget)
        if self.max_num_seqs is None or self.token_budget is None:
            self.max_num_seqs, self.token_budget = self._configured
        self._clamp()
        assert self.max_num_seqs is not None and self.token_budget is not None
        # Requests seated before the cap shrank still decode every step.
        budget = max(self.token_budget, min(len(view.running), view.token_budget))
        return StepLimits(budget, self.max_num_seqs)

    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        if self.max_num_seqs is None or self.token_budget is None:
            return
        if duration > self.target_tpot:
            used_tokens = min(self.token_budget, scheduler_output.num_scheduled_tokens)
            self.token_budget = int(used_tokens * self.decrease_factor)
            # A slow step of mostly prefill is cured by the token budget alone; one of mostly
            # decodes only by fewer seats.
            if scheduler_output.num_decode_tokens >= scheduler_output.num_prefill_tokens:
                used_seqs = min(self.max_num_seqs, scheduler_output.num_rows)
                self.max_num_seqs = int(used_seqs * self.decrease_factor)
        else:
            self.max_num_seqs += self.increase_seqs
            self.token_budget += self.increase_tokens
        self._clamp()

    def _clamp(self) -> None:
        assert self.max_num_seqs is not None and self.token_budget is not None
        max_seqs, max_tokens = self._configured
        low_seqs = min(self.min_num_seqs, max_seqs)
        self.max_num_seqs = max(low_seqs, min(self.max_num_seqs, max_seqs))
        low_tokens = min(max(self.min_token_budget, self.max_num_seqs), max_tokens)
        self.token_budget = max(low_tokens, min(self.token_budget, max_tokens))
