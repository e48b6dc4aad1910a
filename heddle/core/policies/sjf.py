"""Shortest (predicted) job first, with aging.

A request's remaining work is its predicted remaining output (predicted output length minus
tokens generated so far, at least 1) plus `prompt_weight` times its prompt tokens still to
compute. Output lengths come from an online predictor (`predictor.py`) that learns from every
finished request; with `repredict` the remaining output is re-predicted every step from what
the request has generated so far, its phase (thinking or answering) and its class
(`RemainingLenPredictor`) instead of being fixed at arrival. Aging forgives one token of work
per `aging_seconds` since arrival, so a long job is ahead of any job that arrives more than
(its work) * aging_seconds later: no starvation. The default (10 ms a token) lets short requests
pass a 3,000-token prompt for ~30 s at most; with 0.1 s a token (the default before) that was
~300 s, longer than any wait in a run of 30,000 requests at 1.5-3x load, so under sustained
overload the long prompts were never served (docs/POLICIES.md, "Target 1").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy
from heddle.core.policies.predictor import OutputLenPredictor, RemainingLenPredictor
from heddle.core.policies.registry import register
from heddle.core.queues import OrderKey, RankedQueue, WaitingQueue
from heddle.request import FinishReason

if TYPE_CHECKING:
    from collections.abc import Callable

    from heddle.request import Request


class RemainingWorkPolicy(Policy):
    """Order by remaining work minus aging credit; subclasses say how long outputs will be."""

    def __init__(self, aging_seconds: float = 0.01, prompt_weight: float = 1.0) -> None:
        super().__init__()
        if not (aging_seconds > 0 and math.isfinite(aging_seconds)):
            raise ValueError(f"aging_seconds must be positive and finite, got {aging_seconds}")
        if prompt_weight < 0:
            raise ValueError(f"prompt_weight must be >= 0, got {prompt_weight}")
        self.aging_seconds = float(aging_seconds)
        self.prompt_weight = float(prompt_weight)

    def predicted_output_len(self, request: Request) -> float:
        raise NotImplementedError

    def remaining_work(self, request: Request) -> float:
        # No request outgrows its max_tokens, whatever the prediction says.
        predicted = min(self.predicted_output_len(request), request.max_output_tokens)
        remaining_output = max(1.0, predicted - request.num_output_tokens)
        remaining_prompt = max(0, request.num_prompt_tokens - request.num_computed_tokens)
        return remaining_output + self.prompt_weight * remaining_prompt

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        # work - (now - arrival) / aging_seconds, without the `now` term every request shares.
        aged = self.remaining_work(request) + request.arrival_time / self.aging_seconds
        return (aged, request.arrival_time, request.seq)


@register
class SJFPolicy(RemainingWorkPolicy):
    """Shortest predicted remaining work first; the predictor learns from finished requests."""

    name = "sjf"

    def __init__(
        self,
        aging_seconds: float = 0.01,
        prompt_weight: float = 1.0,
        default_output_len: float = 128.0,
        min_samples: int = 2,
        repredict: bool = False,
        repredict_max_tokens: bool = True,
    ) -> None:
        super().__init__(aging_seconds, prompt_weight)
        self.predictor = OutputLenPredictor(default_output_len, min_samples)
        self.remaining: RemainingLenPredictor | None = None
        if repredict:
            self.remaining = RemainingLenPredictor(default_output_len, max(min_samples, 8),
                                                   use_max_tokens=repredict_max_tokens)

    def predicted_output_len(self, request: Request) -> float:
        if self.remaining is not None:
            return request.num_output_tokens + self.remaining.predict_remaining(request)
        return self.predictor.predict(request)

    # A waiting request's tokens do not change, so its key moves only when the predictors
    # learn (a finished request): then every waiting key is recomputed, once, when admission
    # next reads the queue.
    def make_waiting_queue(self, key: OrderKey, now: Callable[[], float]) -> WaitingQueue:
        return RankedQueue(self, now)

    def on_finished(self, request: Request) -> None:
        self.predictor.observe(request)
        if self.remaining is not None:
            self.remaining.observe(request)
        if request.finish_reason is not FinishReason.ABORT and request.num_output_tokens:
            self.keys_epoch += 1  # what the predictors learnt moves every prediction
