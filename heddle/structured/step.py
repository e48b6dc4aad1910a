"""The grammar part of one step, as it crosses the executor contract (no torch here).

`GrammarStep` is the step's `SchedulerOutput.token_masks` (heddle.core.outputs.TokenMasks).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class GrammarStep:
    """The constrained sampling rows of a step, and their token bitmask once it is filled.

    `request_ids`: the requests that sample under a grammar this step. `bitmask` resolves to an
    int32 array [len(request_ids), ceil(vocab / 32)] (bit j of a row set: token j allowed), in
    the order of `request_ids`; it is filled on a worker thread while the forward pass runs.
    """

    request_ids: list[str]
    bitmask: Future[Any] | None = None

    def wait(self) -> Mapping[str, Any]:
        """request id -> its row of the filled bitmask (blocks until it is ready)."""
        if self.bitmask is None:
            return {}
        return dict(zip(self.request_ids, self.bitmask.result(), strict=True))
