"""What every route needs: the engine, the tokenizer, the model's name and the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from heddle.engine.client import EngineClient
from heddle.server.errors import APIError
from heddle.server.metrics import ServerMetrics
from heddle.server.sessions import KnownSessions

# Prompts longer than this (characters) are tokenized off the event loop.
_TOKENIZE_INLINE_CHARS = 4096


class ServerTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str: ...


@dataclass(slots=True)
class ServerState:
    engine: EngineClient
    tokenizer: ServerTokenizer
    model_name: str
    metrics: ServerMetrics
    aliases: frozenset[str] = frozenset()  # other names accepted in the `model` field
    tool_call_parser: str = "auto"  # heddle.tools format name; auto: from the chat template
    sessions: KnownSessions = field(default_factory=KnownSessions)  # for DELETE /v1/sessions
    _token_texts: dict[int, str] = field(default_factory=dict)

    @property
    def max_model_len(self) -> int | None:
        return self.engine.max_model_len

    def check_model(self, name: str | None) -> None:
        if name is None or name == self.model_name or name in self.aliases:
            return
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {self.model_name!r}",
            param="model",
            code="model_not_found",
        )

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) <= _TOKENIZE_INLINE_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)

    async def render_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return await asyncio.to_thread(self.tokenizer.apply_chat_template, messages, **kwargs)

    def token_text(self, token_id: int) -> str:
        """The text of one token, as logprobs show it (special tokens included)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_texts[token_id] = text
        return text
