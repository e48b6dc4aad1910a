"""A request's reasoning phase, tracked token by token; the thinking budget closes the block.

`ReasoningState` lives on the `Request` (principle 8: divergence is state the scheduler sees),
so a policy reads `request.reasoning.phase` like any other field. The engine feeds it every
output token; when a thinking block has used the request's budget, `observe` returns the
closing marker, which the engine appends as the next output token. The parser in
`heddle.reasoning.parser` applies the same rules to the text, so what the client is shown as
reasoning is exactly what the engine counted as thinking:

- every `<think> ... </think>` block is thinking; the markers are neither thinking nor answer
  (nor is a stray `</think>` in the answer);
- the budget is one total over all blocks of a request: a block opened again after the budget
  is spent is closed at once (the re-entry bug of vLLM #43757 / #45984 is not possible);
- the budget counts tokens the engine appended to the output, whatever proposed them (one
  sampled token, or several accepted draft tokens), so speculation cannot run past it.

Simulated requests have no marker tokens: they carry the length of their thinking phase and the
phase turns when the output reaches it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    THINKING = "thinking"
    ANSWERING = "answering"


@dataclass(slots=True)
class ReasoningState:
    """Phase, thinking tokens used and the budget of one request."""

    start_token_id: int | None = None
    end_token_id: int | None = None
    budget: int | None = None  # most thinking tokens (markers excluded); None: unbounded
    phase: Phase = Phase.ANSWERING
    num_thinking_tokens: int = 0  # inside thinking blocks, over all blocks
    num_answer_tokens: int = 0
    num_blocks: int = 0  # thinking blocks entered (a prompt-opened block counts)
    num_forced: int = 0  # closing markers the budget forced
    # Output tokens at which the current phase began (0 for the phase the output starts in).
    phase_start: int = 0
    # Simulated requests: output tokens of the thinking phase, closing marker included.
    true_thinking_len: int | None = None
    _num_output: int = 0

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"thinking budget must be >= 0, got {self.budget}")
        if self.phase is Phase.THINKING:
            self.num_blocks = 1

    @property
    def is_thinking(self) -> bool:
        return self.phase is Phase.THINKING

    @property
    def tokens_in_phase(self) -> int:
        """Output tokens generated since the current phase began."""
        return self._num_output - self.phase_start

    @property
    def thinking_tokens_left(self) -> int | None:
        """Thinking tokens the budget still allows; None when unbounded."""
        if self.budget is None:
            return None
        return max(0, self.budget - self.num_thinking_tokens)

    def observe(self, token_id: int) -> int | None:
        """Account one output token. Returns the token to append next (the closing marker the
        budget forces), or None."""
        self._num_output += 1
        if self.true_thinking_len is not None:
            if self.phase is Phase.THINKING:
                self.num_thinking_tokens += 1
                if self._num_output >= self.true_thinking_len:
                    self._enter(Phase.ANSWERING)
            else:
                self.num_answer_tokens += 1
            return None
        if self.phase is Phase.THINKING:
            if token_id == self.end_token_id:
                self._enter(Phase.ANSWERING)
                return None
            self.num_thinking_tokens += 1
        elif token_id == self.start_token_id:
            self._enter(Phase.THINKING)
            self.num_blocks += 1
        elif token_id == self.end_token_id:
            return None  # a stray closing marker: neither thinking nor answer
        else:
            self.num_answer_tokens += 1
            return None
        if self.budget is not None and self.num_thinking_tokens >= self.budget:
            self.num_forced += 1
            return self.end_token_id
        return None

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self.phase_start = self._num_output
