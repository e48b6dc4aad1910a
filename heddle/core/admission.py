"""Admission control: refuse at arrival what cannot be served in time, instead of queueing it.

Under sustained overload every queue grows without bound: each request admitted beyond what the
engine can serve waits longer than the last, misses its SLO, and still takes the seat and the
compute a servable request needed. A shedder refuses such requests when they arrive (HTTP 429
with a `Retry-After`), so the queue stays as long as the SLO allows and goodput stays flat past
saturation. An `Admission` is consulted by `Scheduler.add_request` and observes every step.

- `slo` (Andes-style, QoE-aware): predict the new request's TTFT from the queue ahead of it *in
  the policy's order* and the service rates measured over the last seconds, and refuse it when
  the prediction exceeds `slack` times its TTFT target (its own `ttft_slo`, else the option
  `ttft_slo`; requests with neither are never refused). Seats: the requests ahead of it and it
  need seats that free up at the measured departure rate (finishes + preemptions per second);
  a request the policy (and the scheduler's preemption guard) would let evict a running one
  needs no free seat. Tokens: the prefill tokens ahead of it, its own and those of running
  prefills are computed at the measured prefill capacity of a step (token budget minus its
  decode tokens) per step time. Stalled: a request ahead of it that has waited longer than
  that without being scheduled shows a queue the rates do not describe (arrivals of higher
  rank keep overtaking it: mlfq's levels, priorities); its wait so far is the prediction.
- `queue`: a plain bound on waiting requests per class (vLLM's and SGLang's queue limits,
  per class): option `max_waiting` is an int, or a dict by class with "*" for the rest.

Both keep, per class, what was offered, admitted and refused, and why (`report()`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.errors import HeddleError
from heddle.request import RequestStatus

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.core.policies import Policy
    from heddle.core.preemption_guard import PreemptionGuard
    from heddle.request import Request

ADMISSION_MODES = ("off", "slo", "queue")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused at arrival, and when trying again could work."""

    # "seats" | "prefill" | "stalled" (slo mode: what the predicted wait was waiting for), "queue"
    reason: str
    message: str
    retry_after: float  # seconds
    predicted_ttft: float | None = None


@dataclass(slots=True)
class ClassAdmission:
    """What the shedder saw of one request class."""

    offered: int = 0
    admitted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # by reason
    predicted_ttft_sum: float = 0.0  # over refused requests with a prediction
    num_ahead_sum: int = 0  # waiting requests ahead of refused ones
    ahead_by_class: dict[str, int] = field(default_factory=dict)  # those, by their class
    # Decisions taken against a tighter class's target (room for the classes behind), and
    # how many of them refused.
    held_to_tighter: int = 0
    refused_held_to_tighter: int = 0

    @property
    def num_refused(self) -> int:
        return sum(self.refused.values())

    def to_dict(self) -> dict[str, Any]:
        refused = self.num_refused
        return {
            "offered": self.offered,
            "admitted": self.admitted,
            "refused": refused,
            "refused_share": refused / self.offered if self.offered else 0.0,
            "refused_by_reason": dict(sorted(self.refused.items())),
            "mean_predicted_ttft": self.predicted_ttft_sum / refused if refused else None,
            "mean_queue_ahead": self.num_ahead_sum / refused if refused else None,
            "mean_queue_ahead_by_class": {
                cls: num / refused for cls, num in sorted(self.ahead_by_class.items())
            }
            if refused
            else {},
            "held_to_tighter_target": self.held_to_tighter,
            "refused_held_to_tighter_target": self.refused_held_to_tighter,
        }


@dataclass(slots=True)
class SchedulerState:
    """What admission reads of the scheduler at an arrival (the live lists, not copies)."""

    now: float
    waiting: Iterable[Request]  # the scheduler's queue (any order)
    running: Sequence[Request]
    policy: Policy
    max_num_seqs: int
    token_budget: int
    guard: PreemptionGuard | None = None  # the scheduler's: an eviction it refuses frees no seat


class _Decayed:
    """Exponentially decayed sums over time: rate() = events per second over ~`tau` seconds."""

    __slots__ = ("last", "tau", "time", "values")

    def __init__(self, tau: float, num: int) -> None:
        self.tau = tau
        self.values = [0.0] * num
        self.time = 0.0  # decayed seconds observed
        self.last: float | None = None

    def add(self, now: float, duration: float, values: Sequence[float]) -> None:
        if self.last is not None and now > self.last:
            keep = math.exp(-(now - self.last) / self.tau)
            self.values = [v * keep for v in self.values]
            self.time *= keep
        self.last = now
        self.time += duration
        for i, v in enumerate(values):
            self.values[i] += v


class Admission:
    """Admits everything; counts arrivals per class. Subclasses refuse."""

    name = "off"

    def __init__(self) -> None:
        self.classes: dict[str, ClassAdmission] = {}

    def check(self, request: Request, state: SchedulerState) -> Refusal | None:
        """None to admit `request` now, else why not. Counts the decision."""
        stats = self.classes.setdefault(request.request_class, ClassAdmission())
        stats.offered += 1
        refusal = self.decide(request, state)
        if refusal is None:
            stats.admitted += 1
        else:
            stats.refused[refusal.reason] = stats.refused.get(refusal.reason, 0) + 1
            if refusal.predicted_ttft is not None:
                stats.predicted_ttft_sum += refusal.predicted_ttft
        return refusal

    def decide(self, request: Request, state: SchedulerState) -> Refusal | None:
        return None

    def observe_step(
        self,
        now: float,
        duration: float,
        output: SchedulerOutput,
        num_finished: int,
        token_budget: int | None = None,
    ) -> None:
        """After every step: what it computed, how long it took, how many requests left, and
        the token budget the policy gave it (`step_limits`; None: the configured one)."""

    def report(self) -> dict[str, dict[str, Any]]:
        """Per class: offered, admitted, refused (by reason), mean predicted TTFT of refusals."""
        return {name: c.to_dict() for name, c in sorted(self.classes.items())}


class QueueBound(Admission):
    """Refuse a request when its class already has `max_waiting` requests waiting."""

    name = "queue"

    def __init__(self, max_waiting: int | Mapping[str, int] = 64, retry_after: float = 1.0) -> None:
        super().__init__()
        bounds = {"*": max_waiting} if isinstance(max_waiting, int) else dict(max_waiting)
        for key, bound in bounds.items():
            if not isinstance(bound, int) or bound < 0:
                raise HeddleError(f"admission queue: max_waiting[{key!r}] must be an int >= 0")
        self.bounds = bounds
        self.retry_after = float(retry_after)

    def decide(self, request: Request, state: SchedulerState) -> Refusal | None:
        cls = request.request_class
        bound = self.bounds.get(cls, self.bounds.get("*"))
        if bound is None:
            return None
        num = sum(1 for r in state.waiting if r.request_class == cls)
        if num < bound:
            return None
        return Refusal(
            "queue",
            f"the waiting queue of class {cls!r} is full ({num} of {bound}); retry later",
            self.retry_after,
        )


class SLOAdmission(Admission):
    """Refuse a request whose predicted TTFT exceeds `slack` times its TTFT target."""

    name = "slo"

    def __init__(
        self,
        slack: float = 0.8,
        ttft_slo: float | None = None,
        window_seconds: float = 5.0,
        min_observed_seconds: float = 0.5,
    ) -> None:
        super().__init__()
        if not slack > 0:
            raise HeddleError(f"admission slo: slack must be positive, got {slack}")
        if ttft_slo is not None and not ttft_slo > 0:
            raise HeddleError(f"admission slo: ttft_slo must be positive, got {ttft_slo}")
        if not window_seconds > 0 or min_observed_seconds < 0:
            raise HeddleError("admission slo: window_seconds must be > 0, min_observed >= 0")
        self.slack = float(slack)
        self.ttft_slo = ttft_slo
        self.window_seconds = float(window_seconds)
        # class -> (the tightest TTFT target of a newcomer that found a request of this class
        # ranked ahead of it, when that was last seen)
        self._behind: dict[str, tuple[float, float]] = {}
        self.min_observed_seconds = float(min_observed_seconds)
        # decayed: departures, steps, decode tokens, the steps' token budgets
        self._rates = _Decayed(window_seconds, 4)
        self._budgeted = False

    # -- what was measured ----------------------------------------------------------------
    def observe_step(
        self,
        now: float,
        duration: float,
        output: SchedulerOutput,
        num_finished: int,
        token_budget: int | None = None,
    ) -> None:
        departures = num_finished + len(output.preempted_request_ids)
        budget = -1.0 if token_budget is None else float(token_budget)
        if budget >= 0:
            self._budgeted = True
        self._rates.add(now, duration, (departures, 1.0, float(output.num_decode_tokens), budget))

    @property
    def departure_rate(self) -> float:
        """Seats freed per second (finishes and preemptions) over the last window."""
        t = self._rates.time
        return self._rates.values[0] / t if t > 0 else 0.0

    @property
    def step_time(self) -> float:
        steps = self._rates.values[1]
        return self._rates.time / steps if steps > 0 else 0.0

    def prefill_per_step(self, token_budget: int) -> float:
        """Tokens of a step left for prefills: the mean budget the policy gave the last steps
        (a policy may cap it below the configured `token_budget`, as slo does to hold TPOTs)
        minus their mean decode tokens."""
        steps = self._rates.values[1]
        decode = self._rates.values[2] / steps if steps > 0 else 0.0
        budget = float(token_budget)
        if self._budgeted and steps > 0:
            budget = min(budget, self._rates.values[3] / steps)
        return max(1.0, budget - decode)

    # -- the decision ---------------------------------------------------------------------
    def predict_ttft(self, request: Request, state: SchedulerState) -> tuple[float, str, int]:
        """(predicted TTFT in seconds, what it waits for: "seats", "prefill" or "stalled",
        queue ahead)."""
        predicted, reason, ahead = self._predict(request, state, self._ahead(request, state))
        return predicted, reason, len(ahead)

    @staticmethod
    def _ahead(request: Request, state: SchedulerState) -> list[Request]:
        """The waiting requests the policy ranks ahead of `request` now."""
        policy = state.policy
        now = state.now
        key = policy.sort_key(request, now)
        return [r for r in state.waiting if policy.sort_key(r, now) < key]

    def _predict(
        self, request: Request, state: SchedulerState, ahead: list[Request]
    ) -> tuple[float, str, list[Request]]:
        now = state.now
        step_time = self.step_time
        per_step = self.prefill_per_step(state.token_budget)
        # Prefill work before its first token: everything ahead of it, running prefills, its own.
        tokens = request.num_uncomputed_tokens + sum(r.num_uncomputed_tokens for r in ahead)
        tokens += sum(r.num_uncomputed_tokens for r in state.running if r.num_uncomputed_tokens > 1)
        prefill_wait = math.ceil(tokens / per_step) * step_time
        own_prefill = math.ceil(request.num_uncomputed_tokens / per_step) * step_time
        free_seats = state.max_num_seqs - len(state.running)
        seats_needed = len(ahead) + 1 - free_seats
        seat_wait = 0.0
        if seats_needed > 0 and not self._can_evict(request, state):
            rate = self.departure_rate
            seat_wait = seats_needed / rate if rate > 0 else math.inf
        seat_ttft = seat_wait + own_prefill
        # What the queue ahead has done, not only what it holds: the longest a request ahead
        # of it has waited without being scheduled. The rates above cannot see arrivals that
        # will overtake it (a policy's higher levels, classes or priorities, fed by a steady
        # stream, e.g. mlfq's skip-join levels under overload); a request ahead that has
        # already waited that long shows the queue there is not moving (CoDel's sojourn time).
        stalled = max(
            (now - r.arrival_time for r in ahead if r.status is RequestStatus.WAITING),
            default=0.0,
        )
        best = max(seat_ttft, prefill_wait, stalled)
        if best == stalled and stalled > 0:
            return stalled, "stalled", ahead
        if seat_ttft >= prefill_wait:
            return seat_ttft, "seats", ahead
        return prefill_wait, "prefill", ahead

    @staticmethod
    def _can_evict(request: Request, state: SchedulerState) -> bool:
        """Would the policy let `request` take a running request's seat now, and the scheduler's
        preemption guard let it?"""
        if not state.running:
            return False
        policy = state.policy
        victim = policy.choose_victim(state.running, state.now)
        if not policy.should_preempt_for(request, victim, state.now):
            return False
        return state.guard is None or state.guard.why_not(victim, state.now) is None

    def _target(self, request: Request) -> float | None:
        return request.ttft_slo if request.ttft_slo is not None else self.ttft_slo

    def _limit_target(self, request: Request, target: float, now: float) -> float:
        """The target `request` is admitted against: its own, or the tighter one of a class
        whose newcomers recently found requests of its class ranked ahead of them."""
        behind = self._behind.get(request.request_class)
        if behind is None or now - behind[1] > self.window_seconds:
            return target
        return min(target, behind[0])

    def _note_ahead(self, target: float, ahead: Sequence[Request], now: float) -> None:
        """A newcomer with TTFT target `target` has `ahead` ranked ahead of it: each looser
        class among them must leave it room (for `window_seconds` from now)."""
        looser = {r.request_class for r in ahead if (self._target(r) or 0.0) > target}
        for cls in looser:
            seen = self._behind.get(cls)
            fresh = seen is not None and now - seen[1] <= self.window_seconds
            self._behind[cls] = (min(target, seen[0]) if fresh and seen else target, now)

    def decide(self, request: Request, state: SchedulerState) -> Refusal | None:
        target = self._target(request)
        if target is None or self._rates.time < self.min_observed_seconds:
            return None
        now = state.now
        ahead = self._ahead(request, state)
        self._note_ahead(target, ahead, now)
        limit_target = self._limit_target(request, target, now)
        predicted, reason, ahead = self._predict(request, state, ahead)
        stats = self.classes[request.request_class]
        held = limit_target < target
        stats.held_to_tighter += held
        limit = self.slack * limit_target
        if predicted <= limit:
            return None
        stats.refused_held_to_tighter += held
        stats.num_ahead_sum += len(ahead)
        for r in ahead:
            stats.ahead_by_class[r.request_class] = stats.ahead_by_class.get(r.request_class, 0) + 1
        retry = predicted - limit if math.isfinite(predicted) else 10 * target
        why = f"the {target:g} s target of class {request.request_class!r}"
        if held:
            why = f"the {limit_target:g} s target of a class behind it (its own {target:g} s)"
        return Refusal(
            reason,
            f"overloaded: predicted time to first token {_seconds(predicted)} exceeds "
            f"{limit:.2f} s ({self.slack:g} x {why}; {len(ahead)} requests ahead, waiting for "
            f"{reason}); retry later",
            retry,
            predicted,
        )


def _seconds(value: float) -> str:
    return "unbounded" if not math.isfinite(value) else f"{value:.2f} s"


def make_admission(name: str, **options: Any) -> Admission:
    """An admission controller by name: "off", "slo" or "queue" (see the module docstring)."""
    kinds: dict[str, type[Admission]] = {"off": Admission, "slo": SLOAdmission, "queue": QueueBound}
    if name not in kinds:
        raise HeddleError(f"unknown admission {name!r}; known: {', '.join(ADMISSION_MODES)}")
    try:
        return kinds[name](**options)
    except TypeError as e:
        raise HeddleError(f"admission {name!r}: {e}") from None
