"""Reasoning models: the `<think>` phase as state the scheduler sees, thinking budgets, and the
split of a model's text into reasoning and answer (whole or streamed)."""

from heddle.reasoning.format import EFFORT_BUDGETS, ReasoningFormat, thinking_budget
from heddle.reasoning.parser import ReasoningParser, ReasoningSplit, ReasoningStream
from heddle.reasoning.phase import Phase, ReasoningState

__all__ = [
    "EFFORT_BUDGETS",
    "Phase",
    "ReasoningFormat",
    "ReasoningParser",
    "ReasoningSplit",
    "ReasoningState",
    "ReasoningStream",
    "thinking_budget",
]
