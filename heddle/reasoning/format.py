"""Which reasoning markers a model uses, and the thinking budget a request asks for.

A model reasons in `<think> ... </think>` when its vocabulary has both markers as single tokens
(Qwen3, QwQ, DeepSeek-R1 and its distills). The markers are looked up by their text among every
token, added ones included (a marker that is an ordinary vocabulary entry counts, unlike a
lookup in the special-token table only). A model whose markers are *special* tokens would lose
them in detokenization, so the text could not be split: it is rejected with a clear error.

Budgets: `max_thinking_tokens` is the number of thinking tokens (markers excluded) after which
the engine closes the block; `reasoning_effort` maps low / medium / high to 1,024 / 8,192 /
24,576 tokens, the mapping Gemini's OpenAI-compatible API documents for the same field, and
"none" to 0 (answer at once). A budget never takes the whole of `max_tokens`: it is capped so
that the closing marker and at least one answer token fit (the "reasoning only, no content"
failure of vLLM #50473's report).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from heddle.errors import InvalidRequestError, ModelLoadError
from heddle.reasoning.parser import ReasoningParser
from heddle.reasoning.phase import Phase, ReasoningState

EFFORT_BUDGETS: dict[str, int] = {"none": 0, "low": 1024, "medium": 8192, "high": 24576}


class MarkerTokenizer(Protocol):
    def token_to_id(self, token: str) -> int | None: ...

    @property
    def all_special_ids(self) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """The thinking markers of one model: their text and their (single) token ids."""

    start_token_id: int
    end_token_id: int
    start: str = "<think>"
    end: str = "</think>"

    @classmethod
    def from_tokenizer(
        cls, tokenizer: MarkerTokenizer, start: str = "<think>", end: str = "</think>"
    ) -> ReasoningFormat | None:
        """The format when the vocabulary has both markers as single tokens, else None."""
        start_id, end_id = tokenizer.token_to_id(start), tokenizer.token_to_id(end)
        if start_id is None or end_id is None:
            return None
        special = set(tokenizer.all_special_ids)
        if start_id in special or end_id in special:
            raise ModelLoadError(
                f"the reasoning markers {start} / {end} are special tokens of this tokenizer: "
                "detokenization would drop them, so reasoning cannot be told from the answer"
            )
        return cls(start_id, end_id, start, end)

    def parser(self) -> ReasoningParser:
        return ReasoningParser(self.start, self.end)

    def starts_in_thinking(self, prompt_token_ids: Sequence[int]) -> bool:
        """True when the prompt leaves a thinking block open (the template opened it): the
        last marker of the prompt decides, so earlier turns' closed blocks do not count."""
        for token_id in reversed(prompt_token_ids):
            if token_id == self.end_token_id:
                return False
            if token_id == self.start_token_id:
                return True
        return False

    def prepare_prompt(
        self, prompt_token_ids: Sequence[int], budget: int | None
    ) -> tuple[list[int], bool]:
        """(prompt ids, output starts in thinking). A budget of 0 on a prompt-opened block
        closes it in the prompt, so not a single thinking token is sampled."""
        ids = list(prompt_token_ids)
        thinking = self.starts_in_thinking(ids)
        if thinking and budget == 0:
            ids.append(self.end_token_id)
            thinking = False
        return ids, thinking

    def new_state(self, prompt_token_ids: Sequence[int], budget: int | None) -> ReasoningState:
        """The state of a request whose prompt went through `prepare_prompt`."""
        thinking = self.starts_in_thinking(prompt_token_ids)
        return ReasoningState(
            self.start_token_id,
            self.end_token_id,
            budget,
            Phase.THINKING if thinking else Phase.ANSWERING,
        )


def thinking_budget(
    max_thinking_tokens: int | None,
    reasoning_effort: str | None,
    max_tokens: int | None,
) -> int | None:
    """The thinking budget of a request (None: unbounded). An explicit count wins over effort."""
    if max_thinking_tokens is not None and max_thinking_tokens < 0:
        raise InvalidRequestError(
            f"max_thinking_tokens must be >= 0, got {max_thinking_tokens}", "max_thinking_tokens"
        )
    budget = max_thinking_tokens
    if budget is None and reasoning_effort is not None:
        if reasoning_effort not in EFFORT_BUDGETS:
            raise InvalidRequestError(
                f"reasoning_effort must be one of {', '.join(EFFORT_BUDGETS)}, "
                f"got {reasoning_effort!r}",
                "reasoning_effort",
            )
        budget = EFFORT_BUDGETS[reasoning_effort]
    if budget is not None and max_tokens is not None:
        # Room for the closing marker and one answer token.
        budget = max(0, min(budget, max_tokens - 2))
    return budget
