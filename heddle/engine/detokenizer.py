"""Incremental detokenization with stop strings that never leak into the streamed text."""

from __future__ import annotations

from typing import Protocol

# Context tokens decoded before the new ones, so merges across the boundary render right.
_CONTEXT_TOKENS = 5


class TokenDecoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text, a delta at a time.

    Text that could be the start of a stop string is held back until it is known not to be
    one, so a streaming client never sees part of a stop string.
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_token_ids: list[int],
        stop: tuple[str, ...] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self._emitted = 0  # characters of self.text already handed out
        self.stop_hit: str | None = None

    def add_tokens(self, token_ids: list[int]) -> None:
        """Append output tokens; may set `stop_hit` and truncate `text` before the stop string."""
        if self.stop_hit is not None:
            return
        self._ids.extend(token_ids)
        prefix = self._tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self._skip
        )
        full = self._tokenizer.decode(
            self._ids[self._prefix_offset :], skip_special_tokens=self._skip
        )
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return  # an incomplete UTF-8 sequence, or nothing visible yet: wait for more tokens
        new_text = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        start = max(0, len(self.text) - self._holdback)
        self.text += new_text
        if self._stop:
            self._find_stop(start)

    def _find_stop(self, start: int) -> None:
        best = -1
        for stop in self._stop:
            pos = self.text.find(stop, start)
            if pos != -1 and (best == -1 or pos < best):
                best, self.stop_hit = pos, stop
        if best != -1:
            self.text = self.text[:best]

    @property
    def emitted_text(self) -> str:
        return self.text[: self._emitted]

    @property
    def num_emitted(self) -> int:
        """Characters of `text` handed out so far."""
        return self._emitted

    def take_delta(self, finished: bool) -> str:
        """Text not handed out yet; while running, keep back what may begin a stop string."""
        if finished or self.stop_hit is not None:
            end = len(self.text)
        else:
            end = max(self._emitted, len(self.text) - self._holdback)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
