"""SLO-aware scheduling: earliest deadline first, with admission that protects running decodes.

Each request has a TTFT and a TPOT target: its own (`Request.ttft_slo`/`tpot_slo`), else its
class's (`ttft={"chat": 1.0}`), else the global default. Deadlines:
- no token yet (waiting or mid-prefill): arrival + TTFT target;
- after k tokens: first token's time + k TPOT targets, the latest the next token may come for
  the mean TPOT to hold (token deadlines as in Andes, Liu et al. 2024): a request decoded
  faster than its target has banked slack and may wait.
Goodput first. A request whose first token is already late can no longer count for goodput:
- a waiting one overdue by more than `late_factor` TTFT targets, and a running one whose first
  token came late, are *lost*: their deadline moves back by `late_shift` TTFT targets (a finite
  amount, so they still run eventually) and their TPOT no longer caps the step;
- with `preempt`, a waiting request that can still make its first-token deadline may take the
  seat (or blocks) of a running one that is lost, or whose banked slack covers waiting again
  for its own TTFT target plus recomputing its context; lost requests go first, the one with
  the least context (cheapest to recompute). `max_preemptions` (None: no bound) bounds how often
  one request may be evicted.

Agent programs: a turn of a session whose program carries a deadline (`program_deadline`,
seconds from the first turn that names it; later turns and sub-agents inherit it) has that
deadline as its first-token deadline, unless it names its own `ttft_slo`: turns of a program due
sooner go first, and a program past its deadline is lost like a late request.

The step time is learned online (`StepTimeModel`: base + seconds per token). `step_limits` caps
the token budget so the predicted step stays within `headroom` of the tightest TPOT target
among requests already decoding; new prefills get only what is left. When even the decodes
alone cannot meet that target the cap would save no one, and the full budget is used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy, SchedulerView, StepLimits
from heddle.core.policies.registry import register
from heddle.core.policies.step_time import StepTimeModel
from heddle.core.queues import OrderKey, RankedQueue

if TYPE_CHECKING:
    from collections.abc import Callable

    from heddle.core.outputs import SchedulerOutput
    from heddle.request import Request

MAX_PROGRAMS = 65_536  # program deadlines remembered (the least recently named are forgotten)
MIN_TARGET = 1e-3  # seconds: the first-token target of a turn that arrives past its deadline


def _targets(name: str, value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must map request classes to seconds, got {value!r}")
    out = {str(k): float(v) for k, v in value.items()}
    if any(v <= 0 for v in out.values()):
        raise ValueError(f"{name} targets must be positive")
    return out


@register
class SLOPolicy(Policy):
    """Earliest deadline first; the step's token budget is capped to hold running TPOTs."""

    name = "slo"

    def __init__(
        self,
        ttft: dict[str, float] | None = None,
        tpot: dict[str, float] | None = None,
        default_ttft: float = 2.0,
        default_tpot: float = 0.2,
        headroom: float = 0.9,
        late_factor: float = 1.0,
        late_shift: float = 10.0,
        min_prefill_tokens: int = 1,
        ewma_alpha: float = 0.1,
        preempt: bool = True,
        max_preemptions: int | None = None,
    ) -> None:
        super().__init__()
        self.ttft = _targets("ttft", ttft or {})
        self.tpot = _targets("tpot", tpot or {})
        if default_ttft <= 0 or default_tpot <= 0:
            raise ValueError("default_ttft and default_tpot must be positive")
        if not 0 < headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {headroom}")
        if late_factor < 0 or late_shift < 0 or min_prefill_tokens < 0:
            raise ValueError("late_factor, late_shift and min_prefill_tokens must be >= 0")
        if max_preemptions is not None and max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0 or None, got {max_preemptions}")
        self.default_ttft = float(default_ttft)
        self.default_tpot = float(default_tpot)
        self.headroom = float(headroom)
        self.late_factor = float(late_factor)
        self.late_shift = float(late_shift)
        self.min_prefill_tokens = int(min_prefill_tokens)
        self.preempt = bool(preempt)
        self.max_preemptions = max_preemptions
        self.step_model = StepTimeModel(alpha=ewma_alpha)
        self.last_cap: int | None = None  # the token budget of the last step, if capped
        self._program_due: OrderedDict[str, float] = OrderedDict()  # program -> deadline

    # -- targets and deadlines --------------------------------------------------------------
    def ttft_target(self, request: Request) -> float:
        if request.ttft_slo is not None:
            return request.ttft_slo
        due = self.program_due(request)
        if due is not None:
            return max(MIN_TARGET, due - request.arrival_time)
        return self.ttft.get(request.request_class, self.default_ttft)

    def program_due(self, request: Request) -> float | None:
        """When the request's program must be done (None: no program deadline). The first
        turn that names a deadline fixes it; later turns and sub-agents inherit it."""
        session = request.session
        if session is None:
            return None
        program = session.program_id
        due = self._program_due.get(program)
        if due is None and session.deadline is not None:
            due = self._program_due[program] = request.arrival_time + session.deadline
            if len(self._program_due) > MAX_PROGRAMS:
                self._program_due.popitem(last=False)
        return due

    def tpot_target(self, request: Request) -> float:
        if request.tpot_slo is not None:
            return request.tpot_slo
        return self.tpot.get(request.request_class, self.default_tpot)

    def first_token_late(self, request: Request) -> bool:
        """Did the first token come after its TTFT target? (False before the first token.)"""
        first = request.first_token_time
        return first is not None and first - request.arrival_time > self.ttft_target(request)

    def is_lost(self, request: Request, now: float) -> bool:
        """Can this request no longer meet its TTFT target (beyond `late_factor` targets)?"""
        if request.first_token_time is not None:
            return self.first_token_late(request)
        ttft = self.ttft_target(request)
        return now - (request.arrival_time + ttft) > self.late_factor * ttft

    def deadline(self, request: Request, now: float) -> float:
        """When this request's next token is due; a lost request's is moved back."""
        if self.is_lost(request, now):
            target = self.ttft_target(request)
            # A program turn's target is what its program had left; it moves back by whole
            # targets of its class, as any late request does.
            unit = target
            if request.ttft_slo is None and self.program_due(request) is not None:
                unit = self.ttft.get(request.request_class, self.default_ttft)
            return request.arrival_time + target + self.late_shift * unit
        first = request.first_token_time
        if first is not None:
            return first + request.num_output_tokens * self.tpot_target(request)
        return request.arrival_time + self.ttft_target(request)

    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        return (self.deadline(request, now), request.arrival_time, request.seq)

    def on_finished(self, request: Request) -> None:
        super().on_finished(request)
        session = request.session
        if session is not None and session.close and session.parent_session_id is None:
            self._program_due.pop(session.session_id, None)  # the program's last turn

    # A waiting request's deadline is fixed (its tokens do not change while it waits) until,
    # without a first token, it becomes lost: then it moves back, once.
    def make_waiting_queue(self, key: OrderKey, now: Callable[[], float]) -> RankedQueue:
        return RankedQueue(self, now)

    def key_change_time(self, request: Request, now: float) -> float | None:
        if request.first_token_time is not None or self.is_lost(request, now):
            return None
        ttft = self.ttft_target(request)
        return request.arrival_time + ttft + self.late_factor * ttft

    # -- preemption -------------------------------------------------------------------------
    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        """A lost request with the least context (cheapest to recompute), else the latest due."""
        lost = [r for r in candidates if self.is_lost(r, now)]
        if lost:
            return min(lost, key=lambda r: (r.num_computed_tokens, -r.arrival_time, -r.seq))
        return max(candidates, key=lambda r: self.sort_key(r, now))

    def should_preempt_for(self, request: Request, victim: Request, now: float) -> bool:
        """For a request that can still be on time: a lost victim, or one with slack to spare."""
        if not (
            self.preempt
            and (
                self.max_preemptions is None or victim.num_preemptions < self.max_preemptions
            )
            and request.first_token_time is None
            and now < request.arrival_time + self.ttft_target(request)
            and victim.first_token_time is not None
        ):
            return False
        if self.first_token_late(victim):
            return True
        recompute = self.step_model.predict(victim.num_tokens) if self.step_model.fitted else 0.0
        return self.deadline(victim, now) - now > self.ttft_target(victim) + recompute

    # -- step shape -------------------------------------------------------------------------
    def step_limits(self, view: SchedulerView) -> StepLimits:
        self.last_cap = None
        decoding = [
            r
            for r in view.running
            if r.first_token_time is not None and not self.first_token_late(r)
        ]
        if not decoding or not self.step_model.fitted:
            return StepLimits(view.token_budget, view.max_num_seqs)
        tightest = min(self.tpot_target(r) for r in decoding)
        cap = self.step_model.max_tokens_within(self.headroom * tightest)
        if cap is None or cap < len(decoding):
            return StepLimits(view.token_budget, view.max_num_seqs)  # infeasible: no one saved
        cap = max(cap, len(decoding) + self.min_prefill_tokens)
        if cap < view.token_budget:
            self.last_cap = cap
        return StepLimits(min(cap, view.token_budget), view.max_num_seqs)

    def on_step_end(self, scheduler_output: SchedulerOutput, duration: float, now: float) -> None:
        self.step_model.observe(scheduler_output.num_scheduled_tokens, duration)
