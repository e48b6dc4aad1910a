"""Where a request's KV blocks lie in the pool: the breaks in its block table.

A block table whose next block is not the one after it in the pool (`b[i + 1] != b[i] + 1`)
has a break there. The decode attention reads a row's K/V block by block; a table that jumps
all over the pool costs it more than one that runs on (measured on the CPU engine: +5 to +16%
at 256-400 tokens of context, docs/BENCHMARKS.md section 4). A long-running engine's FIFO free
pool hands out blocks from all over it; a fresh engine's prompts get runs of consecutive
blocks and its decodes one block at a time, between the other requests' blocks.

`BlockBreaks` follows the tables of the requests an executor holds, from the SchedulerOutputs
it is given (a new request's table, the blocks appended to a known one, the requests that
left), and gives each step the breaks of its decode rows: the `decode_block_breaks` of its
StepShape. Torch-free; one dict update per new block, one lookup per decode row.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import pairwise

from heddle.core.outputs import SchedulerOutput


def table_breaks(block_ids: Sequence[int]) -> int:
    """How many blocks of the table do not follow the block before them in the pool."""
    return sum(1 for a, b in pairwise(block_ids) if b != a + 1)


class BlockBreaks:
    """The breaks of each known request's block table, kept step by step."""

    __slots__ = ("_breaks", "_last")

    def __init__(self) -> None:
        self._breaks: dict[str, int] = {}
        self._last: dict[str, int] = {}  # each table's last block

    def __len__(self) -> int:
        return len(self._breaks)

    def step(self, so: SchedulerOutput) -> int:
        """Take in the step's table changes; the breaks of its decode rows, summed."""
        breaks, last = self._breaks, self._last
        for request_id in (*so.finished_request_ids, *so.preempted_request_ids):
            breaks.pop(request_id, None)  # its table is gone
            last.pop(request_id, None)
        for new in so.new_requests:
            ids = new.block_ids
            breaks[new.request_id] = table_breaks(ids)
            if ids:
                last[new.request_id] = ids[-1]
        for request_id, ids in so.new_block_ids.items():
            if not ids:
                continue
            before = last.get(request_id)
            added = table_breaks(ids) + (before is not None and ids[0] != before + 1)
            breaks[request_id] = breaks.get(request_id, 0) + added
            last[request_id] = ids[-1]
        if not so.num_decode_rows:
            return 0
        get = breaks.get
        return sum(get(rid, 0) for rid, n in zip(so.request_ids, so.num_new_tokens, strict=True)
                   if n == 1)  # fmt: skip


def scattered_tables(
    sizes: Sequence[int], num_blocks: int, scatter: float, rng: random.Random
) -> list[list[int]]:
    """Distinct block tables of `sizes` blocks from a pool of `num_blocks`, each next block a
    jump to a random free block with probability `scatter` (else the block after the last,
    when free): 0 gives runs of consecutive blocks, 1 a pool churned as a long-running
    engine's is."""
    if not 0.0 <= scatter <= 1.0:
        raise ValueError(f"scatter must be in [0, 1], got {scatter}")
    if sum(sizes) > num_blocks:
        raise ValueError(f"{sum(sizes)} blocks wanted from a pool of {num_blocks}")
    free = list(range(num_blocks))
    rng.shuffle(free)
    used: set[int] = set()

    def draw() -> int:
        while True:
            block = free.pop()
            if block not in used:
                return block

    tables = []
    for size in sizes:
        table: list[int] = []
        for _ in range(size):
            nxt = table[-1] + 1 if table else -1
            if table and nxt < num_blocks and nxt not in used and rng.random() >= scatter:
                block = nxt
            else:
                block = draw()
            used.add(block)
            table.append(block)
        tables.append(table)
    return tables
