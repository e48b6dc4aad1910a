"""The preemption guard: a bound on the work preemption may throw away, whatever the policy asks.

Preemption here is by recompute: a victim's KV blocks are freed and its whole context is
computed again when it is readmitted. A policy that lets newcomers evict running requests
(mlfq, slo, priority) can, under sustained overload, keep evicting the same demoted requests:
each is readmitted, recomputes its context, is evicted again before it finishes, and the
recompute eats the machine (issue 16: mlfq at 18,656 preemptions for 3,000 requests, the short
class's throughput 2.7x below fcfs's). The guard is mechanism, not policy:

- **budget**: the tokens preemption throws away (each victim's computed tokens, charged when it
  is evicted) may be at most `max_recompute_ratio` of the tokens computed, both summed over a
  sliding window of about `window_seconds` (exponentially decayed). A preemption that would
  exceed it is refused;
- **hysteresis**: a request evicted before is not evicted again for a newcomer until it has
  computed back what it lost (its context at its last eviction), so that no request is evicted
  twice for the same work.

A refused *policy* preemption (a waiting request asking for a running one's seat or blocks,
`should_preempt_for`) simply does not happen: the newcomer waits. A preemption the KV cache
forces (a running request needs a block and none is free) must happen; when the policy's
victim is refused, the cheapest candidate (fewest computed tokens: the least work lost) is
evicted instead. Either way every eviction is charged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from heddle.errors import HeddleError

if TYPE_CHECKING:
    from heddle.request import Request


class PreemptionGuard:
    """Refuse preemptions beyond a recompute budget; protect requests still recomputing."""

    __slots__ = (
        "_last",
        "_lost_at",
        "computed",
        "computed_total",
        "lost",
        "lost_total",
        "max_recompute_ratio",
        "num_charged",
        "refused",
        "window_seconds",
    )

    def __init__(self, max_recompute_ratio: float | None = 0.1, window_seconds: float = 20.0):
        if max_recompute_ratio is not None and not max_recompute_ratio >= 0:
            raise HeddleError(
                f"max_recompute_ratio must be >= 0 or None, got {max_recompute_ratio}"
            )
        if not window_seconds > 0:
            raise HeddleError(f"recompute_window_seconds must be positive, got {window_seconds}")
        self.max_recompute_ratio = max_recompute_ratio
        self.window_seconds = float(window_seconds)
        self.computed = 0.0  # tokens computed over the window (decayed)
        self.lost = 0.0  # tokens preemption threw away over the window (decayed)
        self._last: float | None = None
        self.computed_total = 0  # over the run, undecayed
        self.lost_total = 0
        self._lost_at: dict[str, int] = {}  # request id -> its context at its last eviction
        self.num_charged = 0
        self.refused = {"budget": 0, "recovering": 0, "forced_redirected": 0}

    @property
    def enabled(self) -> bool:
        return self.max_recompute_ratio is not None

    @property
    def recompute_ratio(self) -> float:
        """Tokens thrown away per token computed, over the window."""
        return self.lost / self.computed if self.computed > 0 else 0.0

    def _decay(self, now: float) -> None:
        if self._last is not None and now > self._last:
            keep = math.exp(-(now - self._last) / self.window_seconds)
            self.computed *= keep
            self.lost *= keep
        self._last = now

    def observe_step(self, now: float, num_computed_tokens: int) -> None:
        """After every step: the tokens it computed."""
        self._decay(now)
        self.computed += num_computed_tokens
        self.computed_total += num_computed_tokens

    def why_not(self, victim: Request, now: float) -> str | None:
        """None if evicting `victim` now is within the guard, else why not."""
        if self.max_recompute_ratio is None:
            return None
        lost_at = self._lost_at.get(victim.request_id)
        if lost_at is not None and victim.num_computed_tokens < lost_at:
            return "recovering"
        self._decay(now)
        if self.lost + victim.num_computed_tokens > self.max_recompute_ratio * self.computed:
            return "budget"
        return None

    def allows(self, victim: Request, now: float) -> bool:
        """May a waiting request evict `victim` now? Counts a refusal."""
        reason = self.why_not(victim, now)
        if reason is not None:
            self.refused[reason] += 1
        return reason is None

    def forced_victim(self, chosen: Request, candidates: Sequence[Request], now: float) -> Request:
        """A preemption the KV cache forces: the policy's `chosen` if within the guard, else the
        candidate whose eviction loses the least work."""
        if self.why_not(chosen, now) is None:
            return chosen
        cheapest = min(candidates, key=lambda r: (r.num_computed_tokens, -r.arrival_time, -r.seq))
        if cheapest is not chosen:
            self.refused["forced_redirected"] += 1
        return cheapest

    def charge(self, victim: Request, now: float) -> None:
        """`victim` is being evicted with its computed tokens."""
        self._decay(now)
        lost = victim.num_computed_tokens
        self.lost += lost
        self.lost_total += lost
        self.num_charged += 1
        self._lost_at[victim.request_id] = max(lost, self._lost_at.get(victim.request_id, 0))

    def forget(self, request_id: str) -> None:
        self._lost_at.pop(request_id, None)

    def report(self) -> dict[str, object]:
        return {
            "max_recompute_ratio": self.max_recompute_ratio,
            "recompute_ratio": self.recompute_ratio,
            "lost_tokens": self.lost_total,
            "computed_tokens": self.computed_total,
            "preemptions_charged": self.num_charged,
            "refused": dict(self.refused),
        }
