"""Program-level least attained service (PLAS; Autellix, Luo et al., arXiv 2502.13965).

An agent program is many LLM calls (the turns of a session and of its sub-agents). Ordering
each call on its own (fcfs, sjf) lets a long program's every turn queue behind newcomers, and
lets one program with many turns crowd out short ones. PLAS orders calls by the service their
*program* has received so far, across all its turns: programs that have had little go first,
so short programs finish quickly and long ones are not starved of their place by turn-level
churn.

Service is counted in tokens: prompt tokens computed (cache hits are free) plus
`output_weight` per generated token, over every finished and running call of the program. As
in Autellix, service is discretized into levels (`num_levels`, the first holding programs with
less than `quantum` tokens, each next one twice as much) so that calls of programs with similar
service are served first come first served (by the program's arrival) rather than reordered
every step. A call that waited `starvation_seconds` is lifted to level 0.

A request's program is its session's (`Request.session`), a sub-agent's its parent's program;
a request without a session is a program of one call.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from heddle.core.policies.base import Policy
from heddle.core.policies.registry import register

if TYPE_CHECKING:
    from heddle.request import Request


@register
class PLASPolicy(Policy):
    """Serve the calls of the programs with the least attained service first."""

    name = "plas"

    def __init__(
        self,
        quantum: float = 2048.0,
        num_levels: int = 8,
        output_weight: float = 2.0,
        starvation_seconds: float = 60.0,
        preempt: bool = False,
    ) -> None:
        super().__init__()
        if not quantum > 0 or num_levels < 1 or output_weight < 0:
            raise ValueError("quantum must be positive, num_levels >= 1, output_weight >= 0")
        if not starvation_seconds > 0:
            raise ValueError(f"starvation_seconds must be positive, got {starvation_seconds}")
        self.quantum = float(quantum)
        self.num_levels = int(num_levels)
        self.output_weight = float(output_weight)
        self.starvation_seconds = float(starvation_seconds)
        self.preempt = bool(preempt)
        self.service: dict[str, float] = {}  # program -> service of its finished calls
        self._arrival: dict[str, float] = {}  # program -> arrival of its first call
        self._program_of_session: dict[str, str] = {}

    # -- programs ---------------------------------------------------------------------------
    def program_of(self, request: Request) -> str:
        session = request.session
        if session is None:
            return request.request_id
        program = self._program_of_session.get(session.session_id)
        if program is None:
            parent = session.parent_session_id
            program = self._program_of_session.get(parent, parent) if parent else None
            program = program or session.session_id
            self._program_of_session[session.session_id] = program
        return program

    def call_service(self, request: Request) -> float:
        """What this call has received so far."""
        prompt = min(request.num_computed_tokens, request.num_prompt_tokens)
        computed_prompt = max(0, prompt - request.num_cached_tokens)
        return computed_prompt + self.output_weight * request.num_output_tokens

    def attained(self, request: Request) -> float:
        """The program's service: its finished calls' and this call's. (Other running calls
        of the program count when they finish: the key of a request changes only through its
        own progress or a finish.)"""
        return self.service.get(self.program_of(request), 0.0) + self.call_service(request)

    def level(self, service: float) -> int:
        if service < self.quantum:
            return 0
        return min(self.num_levels - 1, 1 + int(math.log2(service / self.quantum)))

    # -- order ------------------------------------------------------------------------------
    def sort_key(self, request: Request, now: float) -> tuple[float, ...]:
        program = self.program_of(request)
        arrival = self._arrival.setdefault(program, request.arrival_time)
        level = self.level(self.attained(request))
        if request.num_computed_tokens == 0 and now - request.arrival_time >= (
            self.starvation_seconds
        ):
            level = 0
        return (level, arrival, request.arrival_time, request.seq)

    def should_preempt_for(self, request: Request, victim: Request, now: float) -> bool:
        return self.preempt and self.sort_key(request, now)[0] < self.sort_key(victim, now)[0]

    # -- hooks ------------------------------------------------------------------------------
    def on_finished(self, request: Request) -> None:
        program = self.program_of(request)
        self.service[program] = self.service.get(program, 0.0) + self.call_service(request)
        session = request.session
        if session is not None and session.close:
            self._program_of_session.pop(session.session_id, None)
            if session.session_id == program:  # the root program ended
                self.service.pop(program, None)
                self._arrival.pop(program, None)
        elif session is None:
            self.service.pop(program, None)
            self._arrival.pop(program, None)
