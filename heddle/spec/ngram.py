"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n from `max_n` down to `min_n`). No extra model.

Each request keeps an index from every n-gram of its known tokens (prompt and output) to the
position right after its latest occurrence, updated as tokens are appended, so a proposal costs
`max_n - min_n + 1` dictionary lookups, not a scan of the context. Known tokens only ever grow
(rejected drafts never become known tokens), so the index never has to forget an entry; a
request whose tokens no longer extend what was indexed (a new request under a reused id) is
re-indexed from scratch. Pure Python: the scheduler side may use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Index:
    num_indexed: int = 0  # tokens whose n-grams ending before them are in `after`
    head: tuple[int, ...] = ()  # the first tokens indexed: detects a reused request id
    # (n-gram) -> position of the token that followed its latest occurrence.
    after: dict[tuple[int, ...], int] = field(default_factory=dict)


class NgramProposer:
    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._indexes: dict[str, _Index] = {}

    def propose(self, request_id: str, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `token_ids` (fewer, or none, when nothing matches)."""
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        index = self._update(request_id, token_ids)
        length = len(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = index.after.get(tuple(token_ids[length - n :]))
            if start is not None:
                return list(token_ids[start : min(start + k, length)])
        return []

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._indexes.pop(request_id, None)

    def _update(self, request_id: str, token_ids: Sequence[int]) -> _Index:
        index = self._indexes.get(request_id)
        head = tuple(token_ids[: self.max_n])
        if index is None or index.num_indexed > len(token_ids) or index.head != head:
            index = self._indexes[request_id] = _Index(head=head)
        after = index.after
        # The n-grams that end just before position p, for each newly known token p: the
        # latest occurrence wins. The sequence's own last n-gram is not indexed (nothing
        # follows it yet), so a lookup finds an earlier occurrence.
        for position in range(max(index.num_indexed, 1), len(token_ids)):
            for n in range(self.min_n, min(self.max_n, position) + 1):
                after[tuple(token_ids[position - n : position])] = position
        index.num_indexed = len(token_ids)
        return index
