"""Isolation lanes: long contexts share each step with short ones, but only up to a cap.

A request is in the "long" lane when its prompt has at least `long_prompt_tokens` tokens or it
has generated at least `long_output_tokens`; otherwise in the "short" lane. Short requests are
ordered before long ones, so a short prompt is admitted in the first step it can be.

Each step, while short requests have work, the long lane may take at most `long_share` of the
token budget (a cap: long prefills do not stretch the steps short decodes wait on) and at least
`long_min_share` of it (a guarantee: long requests always progress); between the two it takes
what the short lane's demand leaves. When no short request has work, the long lane may take
the whole budget. The short lane gets whatever the long lane does not use. A lane's demand is
what its running requests still have to compute plus the prompts of its waiting requests that
can get a seat this step.

Short requests pass long ones for at most `long_delay_seconds`: a long request ranks as if it
had arrived that much later (priority's aging, one level). The token caps above do not bound
that: once every seat is taken, the order of the waiting queue decides who gets a seat, and
under sustained overload short requests alone keep the seats full, so with no bound
(`long_delay_seconds=inf`) the long lane is never admitted again (0.1 of 3.4 long requests/s
in docs/POLICIES.md, "Target 1"). With the bound, a long request waits at most that much longer
than a short one that arrived with it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import register

if TYPE_CHECKING:
    from heddle.request import Request

SHORT_LANE = "short"
LONG_LANE = "long"


@register
class LanesPolicy(Policy):
    """Short lane first; the long lane's share of a step is capped while short has demand."""

    name = "lanes"
    # A waiting request's lane is fixed while it waits; a running one's moves to "long" when
    # its output grows past long_output_tokens.
    waiting_order_changes = False
    running_order_changes = True

    def __init__(
        self,
        long_prompt_tokens: int = 2048,
        long_output_tokens: int = 1024,
        long_share: float = 0.25,
        long_min_share: float = 0.05,
        long_delay_seconds: float = 30.0,
    ) -> None:
        super().__init__()
        if long_prompt_tokens < 1 or long_output_tokens < 1:
            raise ValueError("long_prompt_tokens and long_output_tokens must be positive")
        if not 0 <= long_min_share <= long_share <= 1:
            raise ValueError("need 0 <= long_min_share <= long_share <= 1")
        if not long_delay_seconds >= 0:  # inf: short requests always first
            raise ValueError(f"long_delay_seconds must be >= 0, got {long_delay_seconds}")
        self.long_delay_seconds = float(long_delay_seconds)
        self.long_prompt_tokens = long_prompt_tokens
        self.long_output_tokens = long_output_tokens
        self.long_share = float(long_share)
        self.long_min_share = float(long_min_share)

    def lane_of(self, request: Request) -> str:
        if (
            request.num_prompt_tokens >= self.long_prompt_tokens
            or request.num_output_tokens >= self.long_output_tokens
        ):
            return LONG_LANE
        return SHORT_LANE

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        is_long = self.lane_of(request) == LONG_LANE
        if math.isinf(self.long_delay_seconds):
            return (int(is_long), request.arrival_time, request.seq)
        # A virtual arrival time: fixed while the request waits (its lane cannot change then).
        delay = self.long_delay_seconds if is_long else 0.0
        return (0, request.arrival_time + delay, request.seq)

    def step_limits(self, view: SchedulerView) -> StepLimits:
        demand = {SHORT_LANE: 0, LONG_LANE: 0}
        for request in view.running:
            demand[self.lane_of(request)] += request.num_uncomputed_tokens
        # Only the waiting requests that can get a seat this step count: a queue that cannot
        # be admitted must not hold the long lane back.
        seats = max(0, view.max_num_seqs - len(view.running))
        for request in self.first_waiting(view, seats):
            demand[self.lane_of(request)] += request.num_tokens
        budget = view.token_budget
        if demand[SHORT_LANE] == 0:
            long_budget = budget
        else:
            # At least one token when the share is positive, so long requests always progress.
            floor = math.ceil(self.long_min_share * budget)
            cap = max(floor, int(self.long_share * budget))
            long_budget = min(cap, max(floor, budget - demand[SHORT_LANE]))
        short_budget = budget - min(long_budget, demand[LONG_LANE])
        lanes = {SHORT_LANE: short_budget, LONG_LANE: long_budget}
        return StepLimits(budget, view.max_num_seqs, lanes)
