"""Splitting a reasoning model's text into its reasoning and its answer, whole or streamed.

A reasoning model writes `<think> ... </think>` before its answer. The block may be opened by
the chat template (DeepSeek-R1, Qwen3.5+: the generation prompt ends with `<think>\\n`, so the
output starts inside it) or by the model (Qwen3: the output starts with `<think>`); which one is
read from the prompt (`ReasoningFormat.prepare_prompt`), never guessed from the output.

The rules are those of the engine's token-level `ReasoningState`, so the text the client sees
and the phase the scheduler sees cannot disagree: every `<think> ... </think>` block is
reasoning (a block after an answer included), the markers belong to neither part, a `<think>`
inside a block is reasoning text and a `</think>` in the answer (a model closing twice, as
after a forced close) is dropped. Whitespace: each part drops the whitespace that starts it,
and a block drops the whitespace before its `</think>`; the reasoning of several blocks is
joined by a blank line.

`ReasoningStream` does the same on deltas: text that may be the start of a marker is held
back until the next delta tells, so a partial `</think>` never leaks into content, however the
text is chunked (property-tested).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_SEPARATOR = "\n\n"  # between the reasoning of two thinking blocks


@dataclass(slots=True)
class ReasoningSplit:
    """A piece of output: its reasoning part and its answer part."""

    reasoning: str = ""
    content: str = ""

    def extend(self, other: ReasoningSplit) -> None:
        self.reasoning += other.reasoning
        self.content += other.content


class ReasoningParser:
    """The markers of one model family; `parse` a whole text or `stream` deltas."""

    def __init__(self, start: str = "<think>", end: str = "</think>") -> None:
        if not start or not end:
            raise ValueError("reasoning markers must not be empty")
        self.start = start
        self.end = end

    def stream(self, in_reasoning: bool = False) -> ReasoningStream:
        return ReasoningStream(self.start, self.end, in_reasoning)

    def parse(self, text: str, in_reasoning: bool = False) -> ReasoningSplit:
        stream = self.stream(in_reasoning)
        out = stream.feed(text)
        out.extend(stream.finish())
        return out


class ReasoningStream:
    """Incremental split of one output's text. `feed` each delta, then `finish` once."""

    def __init__(self, start: str, end: str, in_reasoning: bool) -> None:
        self._start = start
        self._end = end
        self.in_reasoning = in_reasoning
        self._pending = ""  # text not yet split: it may end with part of a marker
        self._at_part_start = True  # strip the whitespace that opens a part
        self._held_space = ""  # whitespace at the end of reasoning: dropped before `</think>`
        self._any_reasoning = False
        self.num_blocks_closed = 0

    def feed(self, delta: str) -> ReasoningSplit:
        out = ReasoningSplit()
        self._pending += delta
        while True:
            # In a block only `</think>` ends it; in the answer `<think>` opens a block and a
            # stray `</think>` (a model closing twice) is dropped.
            markers = (self._end,) if self.in_reasoning else (self._start, self._end)
            found = [(i, m) for m in markers if (i := self._pending.find(m)) >= 0]
            if found:
                index, marker = min(found)
                self._emit(self._pending[:index], out)
                self._pending = self._pending[index + len(marker) :]
                if marker == self._end and not self.in_reasoning:
                    continue
                if self.in_reasoning:
                    self.num_blocks_closed += 1
                self.in_reasoning = not self.in_reasoning
                self._held_space = ""
                self._at_part_start = True
                continue
            keep = max(_partial_suffix(self._pending, m) for m in markers)
            self._emit(self._pending[: len(self._pending) - keep], out)
            self._pending = self._pending[len(self._pending) - keep :]
            return out

    def finish(self) -> ReasoningSplit:
        """The text held back (a partial marker that never completed is text after all)."""
        out = ReasoningSplit()
        self._emit(self._pending, out)
        self._pending = ""
        self._held_space = ""  # reasoning never ends in whitespace
        return out

    def _emit(self, text: str, out: ReasoningSplit) -> None:
        if not text:
            return
        if self._at_part_start:
            text = text.lstrip()
            if not text:
                return
            self._at_part_start = False
            if self.in_reasoning and self._any_reasoning:
                text = BLOCK_SEPARATOR + text
        if not self.in_reasoning:
            out.content += text
            return
        self._any_reasoning = True
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = text[len(body) :]
        out.reasoning += body


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
