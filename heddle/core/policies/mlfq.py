"""Multi-level feedback queue with skip-join, in the style of FastServe (Wu et al., 2023).

Levels 0 (served first) .. num_levels-1. Skip-join: a request enters at the first level whose
prompt allowance (`prompt_quantum` * 2**level tokens) holds its prompt, so long prompts start
lower instead of blocking the top level. At level i a request may generate
`quantum` * 2**i tokens; then it is demoted one level. Within a level: arrival order.
A waiting request may preempt a running one of a strictly lower level (option `preempt`).
Starvation prevention: a request not served for `starvation_seconds` is promoted to level 0
with a fresh quantum.

Phase-aware (option `phase_aware`, for reasoning models): a request that is thinking
(`Request.reasoning` in THINKING) ranks below every request that is answering -- a chat
request without a thinking phase, or a reasoning request whose answer has started -- whatever
their levels: the answer is what a client waits for token by token, the thinking is
background work. Within each phase the levels apply as usual (a long thinking phase keeps
sinking, starving thinkers are promoted among the thinkers), and when a request starts its
answer it enters level 0 with a fresh quantum, once. Without the phase split, starvation
promotion undoes mlfq under sustained overload: every queued request waits past
`starvation_seconds`, is promoted to level 0 and, being older, ranks ahead of a new short
request (docs/SPECULATION.md, "Reasoning phases", has the study).

Preemption here is by recompute (FastServe swaps KV to host memory instead), so each eviction
throws away the victim's whole context once its cached blocks are reused. Under sustained
overload, once requests wait longer than `starvation_seconds`, promoted requests keep evicting
the same demoted ones and, unguarded, throughput collapses (issue 16). The scheduler's
preemption guard (heddle/core/preemption_guard.py, on by default) refuses evictions beyond a
recompute budget, whatever this policy asks; `max_preemptions` also bounds how many times a
request may be evicted for a newcomer (None: no bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy
from heddle.core.policies.registry import register
from heddle.core.queues import OrderKey, RankedQueue
from heddle.request import RequestStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from heddle.core.outputs import SchedulerOutput
    from heddle.request import Request

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@dataclass(slots=True)
class _Place:
    level: int
    level_start_output: int  # output tokens the request had when it entered this level
    last_served: float
    answering: bool = False  # phase_aware: promoted for its answer already


@register
class MLFQPolicy(Policy):
    """Serve higher levels first; demote after a level's quantum; promote the starving."""

    name = "mlfq"

    def __init__(
        self,
        num_levels: int = 4,
        quantum: int = 16,
        prompt_quantum: int = 512,
        starvation_seconds: float = 10.0,
        preempt: bool = True,
        max_preemptions: int | None = None,
        phase_aware: bool = False,
    ) -> None:
        super().__init__()
        if num_levels < 1 or quantum < 1 or prompt_quantum < 1:
            raise ValueError("num_levels, quantum and prompt_quantum must be positive")
        if max_preemptions is not None and max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0 or None, got {max_preemptions}")
        if not starvation_seconds > 0:
            raise ValueError(f"starvation_seconds must be positive, got {starvation_seconds}")
        self.num_levels = num_levels
        self.quantum = quantum
        self.prompt_quantum = prompt_quantum
        self.starvation_seconds = float(starvation_seconds)
        self.preempt = preempt
        self.max_preemptions = max_preemptions
        self.phase_aware = phase_aware
        self._places: dict[str, _Place] = {}
        self._moved: list[str] = []  # waiting requests whose level changed (promotions)

    def entry_level(self, request: Request) -> int:
        """Skip-join: the first level whose prompt allowance holds the prompt."""
        ratio = request.num_prompt_tokens / self.prompt_quantum
        level = 0 if ratio <= 1 else math.ceil(math.log2(ratio))
        return min(level, self.num_levels - 1)

    def level_of(self, request: Request, now: float) -> int:
        """The request's level at `now`, applying any demotion or promotion that is due."""
        place = self._places.get(request.request_id)
        if place is None:
            place = _Place(
                self.entry_level(request), request.num_output_tokens, request.arrival_time
            )
            self._places[request.request_id] = place
        if self.phase_aware and not place.answering:
            state = request.reasoning
            if state is not None and state.num_blocks and not state.is_thinking:
                place.answering = True
                place.level = 0
                place.level_start_output = request.num_output_tokens
        while place.level < self.num_levels - 1:
            used = request.num_output_tokens - place.level_start_output
            allowance = self.quantum << place.level
            if used < allowance:
                break
            place.level += 1
            place.level_start_output += allowance
        if now - place.last_served >= self.starvation_seconds:
            if place.level and request.status in _WAITING:
                self._moved.append(request.request_id)
            place.level = 0
            place.level_start_output = request.num_output_tokens
            place.last_served = now
        return place.level

    def rank(self, request: Request, now: float) -> tuple[int, int]:
        """(phase, level): phase 1 while thinking with `phase_aware`, else 0; lower first."""
        level = self.level_of(request, now)
        if self.phase_aware:
            state = request.reasoning
            return (1 if state is not None and state.is_thinking else 0, level)
        return (0, level)

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        return (*self.rank(request, now), request.arrival_time, request.seq)

    # A waiting request's level moves only when it is promoted (it is not served, so it is
    # not demoted): its key is fixed until `starvation_seconds` after it was last served.
    def make_waiting_queue(self, key: OrderKey, now: Callable[[], float]) -> RankedQueue:
        return RankedQueue(self, now)

    def key_change_time(self, request: Request, now: float) -> float | None:
        place = self._places.get(request.request_id)
        return None if place is None else place.last_served + self.starvation_seconds

    def take_moved(self) -> list[str]:
        moved, self._moved = self._moved, []
        return moved

    def should_preempt_for(self, request: Request, victim: Request, now: float) -> bool:
        if self.max_preemptions is not None and victim.num_preemptions >= self.max_preemptions:
            return False
        return self.preempt and self.rank(request, now) < self.rank(victim, now)

    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        places = self._places
        for request_id in scheduler_output.request_ids:
            place = places.get(request_id)
            if place is not None:
                place.last_served = now

    def on_finished(self, request: Request) -> None:
        self._places.pop(request.request_id, None)
