"""What one grammar-constrained row costs a step on the host: the simulator's constrained-row term.

`measure_row_cost` runs the engine's own per-row work on the real tokenizer, alone (no forward
pass): `GrammarMatchers` fills the bitmask of `rows` matchers of a JSON schema, the sampler's
`apply_token_bitmask` applies it to a [rows, vocab] float32 logits tensor, and each matcher
accepts the token picked from its masked logits (random logits: each matcher walks its own
random valid document, as sequences under one schema do; a finished document starts over,
untimed). Per repeat, the three parts are timed apart; the per-row cost is the sum of their
medians divided by `rows`. `heddle profile` stores it as the profile's `constrained_rows`
coefficient; benchmarks/grammar_overhead.py prints it beside the in-batch slope.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from heddle.errors import HeddleError
from heddle.model.sampler import apply_token_bitmask
from heddle.structured.compiler import GrammarCompiler
from heddle.structured.matchers import GrammarMatchers
from heddle.structured.spec import GrammarSpec

# An array of objects with an integer, a bounded string, an enum array and a boolean: the
# schema of benchmarks/grammar_overhead.py (long enough that no matcher finishes quickly).
SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "tags", "ok"],
    },
    "minItems": 10,
}


@dataclass(frozen=True, slots=True)
class RowCost:
    """Median seconds per step of `rows` constrained rows, by part, and per row in all."""

    rows: int
    repeats: int
    fill_s: float  # bitmask fill of all rows (xgrammar)
    apply_s: float  # the mask applied to their logits
    accept_s: float  # each matcher advanced by its token
    per_row_s: float  # (fill + apply + accept) / rows

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure_row_cost(
    tokenizer: Any,
    vocab_size: int,
    *,
    rows: int = 8,
    repeats: int = 64,
    warmup: int = 8,
    schema: dict[str, Any] | None = None,
    seed: int = 0,
) -> RowCost:
    """Time the per-row grammar work of `rows` constrained sequences (see the module doc)."""
    if rows < 1 or repeats < 1 or warmup < 0:
        raise HeddleError("rows and repeats must be >= 1 and warmup >= 0")
    matchers = GrammarMatchers(GrammarCompiler(tokenizer, vocab_size))
    compiled = matchers.compiler.compile(GrammarSpec.json_schema(schema or SCHEMA))
    ids = [f"row-{i}" for i in range(rows)]
    outputs: dict[str, list[int]] = {}

    def restart(request_id: str) -> None:
        matchers.remove(request_id)
        matchers.add(request_id, compiled)
        outputs[request_id] = []

    for request_id in ids:
        restart(request_id)
    generator = torch.Generator().manual_seed(seed)
    rows_index = list(range(rows))
    fills: list[float] = []
    applies: list[float] = []
    accepts: list[float] = []
    for repeat in range(warmup + repeats):
        logits = torch.rand(rows, vocab_size, generator=generator)
        t0 = time.perf_counter()
        bitmask = matchers.start_step(ids, overlap=False).wait()
        t1 = time.perf_counter()
        apply_token_bitmask(logits, rows_index, torch.stack([bitmask[r] for r in ids]))
        t2 = time.perf_counter()
        tokens = logits.argmax(dim=1).tolist()
        for request_id, token in zip(ids, tokens, strict=True):
            outputs[request_id].append(token)
        t3 = time.perf_counter()
        for request_id in ids:
            if not matchers.accept(request_id, outputs[request_id]):
                raise HeddleError(f"{request_id}: the grammar rejected a token its mask allowed")
        t4 = time.perf_counter()
        if repeat >= warmup:
            fills.append(t1 - t0)
            applies.append(t2 - t1)
            accepts.append(t4 - t3)
        for request_id in ids:
            if matchers.is_terminated(request_id):
                restart(request_id)
    matchers.close()
    fill, apply, accept = (statistics.median(x) for x in (fills, applies, accepts))
    return RowCost(rows, repeats, fill, apply, accept, (fill + apply + accept) / rows)
