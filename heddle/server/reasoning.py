"""Reasoning in chat completions: `message.reasoning` apart from `content`, streamed too.

`message.reasoning` is the current field name (vLLM, OpenRouter); `reasoning_content` is the
older one (DeepSeek's API, clients written for it): both carry the same text. A request's
thinking budget comes from `max_thinking_tokens` or `reasoning_effort`; the prompt goes through
the same `ReasoningFormat.prepare_prompt` the engine applies, so the parser starts in the phase
the engine's `ReasoningState` starts in.
"""

from __future__ import annotations

from typing import Any

from heddle.errors import ModelLoadError
from heddle.reasoning import ReasoningFormat, ReasoningParser, ReasoningSplit, ReasoningStream


def reasoning_format_of(tokenizer: Any) -> ReasoningFormat | None:
    """The model's reasoning markers, or None (no markers, or markers decoding would drop)."""
    if not hasattr(tokenizer, "token_to_id") or not hasattr(tokenizer, "all_special_ids"):
        return None
    try:
        return ReasoningFormat.from_tokenizer(tokenizer)
    except ModelLoadError:
        return None


class ReasoningView:
    """Splits the text of each choice of one request into reasoning and content."""

    def __init__(self, parser: ReasoningParser, starts_in_thinking: bool) -> None:
        self.parser = parser
        self.starts_in_thinking = starts_in_thinking
        self._streams: dict[int, ReasoningStream] = {}

    def message(self, text: str) -> dict[str, Any]:
        return _fields(self.parser.parse(text, self.starts_in_thinking), final=True)

    def delta(self, index: int, delta_text: str, finished: bool) -> dict[str, Any]:
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = self.parser.stream(self.starts_in_thinking)
        split = stream.feed(delta_text)
        if finished:
            split.extend(stream.finish())
        return _fields(split, final=False)


def _fields(split: ReasoningSplit, final: bool) -> dict[str, Any]:
    if final:
        reasoning = split.reasoning or None
        return {"content": split.content, "reasoning": reasoning, "reasoning_content": reasoning}
    out: dict[str, Any] = {}
    if split.reasoning:
        out["reasoning"] = out["reasoning_content"] = split.reasoning
    if split.content:
        out["content"] = split.content
    return out
