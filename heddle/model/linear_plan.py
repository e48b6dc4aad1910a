"""Which kernel each linear layer runs, and at which row counts (`--quantization`).

- `none`: the float path (heddle.model.layers.Linear) everywhere.
- `int8` / `int4`: every projection in int8 / int4 (groups of 32), at every row count: the least
  memory. Both keep a quantized file's own numbers: `int4` runs the file's Q4_x blocks on the
  int4 kernel, `int8` runs the file's blocks (Q8_0, or Q4_x as 8-bit codes) in groups of 32
  (`GroupInt8Linear`); a float weight is quantized at load (int4: min/max per group, int8:
  symmetric per group, as Q8_0). The LM head stays 8-bit in `int4` mode (as llama.cpp's Q4
  files keep their embeddings at 8 bits), with the file's own Q8_0 numbers. Where the int4
  kernel does not take a shape (N not a multiple of 16), int8 runs per output channel.
- `auto`: on a checkpoint that is already quantized (GGUF Q4_0 / Q4_1 / Q8_0), each projection
  may run a weight-only kernel at the file's own bit width (4-bit blocks run the int4 kernel with
  the file's own numbers; Q8_0 blocks the grouped int8, also the file's own numbers) beside the
  float path, and which one runs
  depends on the step's row count: at load time `tune_dispatch` times both over every layer of
  each kind (qkv, o, gate_up, down, lm_head) at 1, 2, 4, ... rows and keeps the quantized kernel
  up to the largest row count where it is still clearly faster (medians, a 10% margin); the
  plan is timed once per machine and cached (heddle.model.tuning_cache), so every process on
  the machine runs the same kernels. Weight-only kernels win where a step is
  bound by weight bytes (few rows: decoding) and lose where it is bound by arithmetic (a prefill
  chunk), and where the crossover lies differs per CPU (AMX vs AVX-512 vs AVX2): hence a
  measurement, not a table. A float checkpoint runs `auto` as `none`: auto never quantizes what
  the file did not.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from heddle.errors import HeddleError
from heddle.model.layers import Linear
from heddle.model.quant import (
    QUANTIZATION_MODES,
    BlockQuantized,
    GroupInt8Linear,
    Int4Linear,
    Int8Linear,
    int4_supported,
    int8_supported,
    quantize_int4_blocks,
    quantize_int8_blocks,
)

logger = logging.getLogger(__name__)

# Row counts tried by tune_dispatch; beyond the last one the float path always runs.
TUNE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class LinearLayer(Protocol):
    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DispatchLinear:
    """Runs `small` (a weight-only kernel) for steps of at most `max_rows` rows and `large`
    (the float path, or None when there is none) above; adds the bias."""

    __slots__ = ("bias", "in_features", "kind", "large", "max_rows", "out_features", "small")

    def __init__(self, small: LinearLayer, large: Linear | None, bias: torch.Tensor | None,
                 kind: str, max_rows: int) -> None:
        self.small: LinearLayer | None = small
        self.large = large
        self.bias = bias
        self.kind = kind
        self.max_rows = max_rows
        self.in_features, self.out_features = small.in_features, small.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and (self.large is None or x.shape[0] <= self.max_rows):
            y = self.small(x)
            return y if self.bias is None else y + self.bias
        assert self.large is not None
        y = self.large(x)  # built without the bias: it is added here on both paths
        return y if self.bias is None else y + self.bias

    def drop_small(self) -> None:
        """The quantized kernel never wins: free it (the float path stays)."""
        assert self.large is not None
        self.small, self.max_rows = None, 0


@dataclass(slots=True)
class LinearBuilder:
    """Builds each linear layer of a network for one quantization mode."""

    mode: str
    dtype: torch.dtype
    device: torch.device
    blocks: dict[str, BlockQuantized] = field(default_factory=dict)  # the file's own, HF names
    built: list[DispatchLinear] = field(default_factory=list)
    # Kinds (qkv, o, gate_up, down, lm_head) kept on the float path whatever the mode: to find
    # which layers cost quality (benchmarks/quant_quality.py --float-kinds).
    float_kinds: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mode not in QUANTIZATION_MODES:
            raise HeddleError(f"unknown quantization {self.mode!r}: use "
                              + ", ".join(QUANTIZATION_MODES))
        quantized = self.mode != "none"
        if quantized and self.device.type != "cpu":
            if self.mode != "auto":
                raise HeddleError(f"quantization {self.mode} runs on CPU only")
            self.mode = "none"
        if self.mode == "auto" and not self.blocks:
            self.mode = "none"  # a float checkpoint: auto never quantizes it
        if self.mode != "none" and not int8_supported():
            raise HeddleError("this torch build has no weight-only int8 kernel")

    def build(self, kind: str, names: Sequence[str], weights: Sequence[torch.Tensor],
              bias: torch.Tensor | None = None) -> LinearLayer:
        """One layer computing the rows of `weights` (float, [N_i, K] each) stacked in order;
        `names` are their checkpoint names (to find the file's own blocks)."""
        float_weight = torch.cat(list(weights)) if len(weights) > 1 else weights[0]
        if self.mode == "none" or kind in self.float_kinds:
            return Linear(float_weight.to(device=self.device, dtype=self.dtype), bias)
        blocks = [self.blocks.get(name) for name in names]
        file_blocks = (BlockQuantized.cat([b for b in blocks if b is not None])
                       if all(b is not None for b in blocks) else None)
        out_features, in_features = float_weight.shape
        small = self._small(kind, float_weight, file_blocks, in_features, out_features)
        if small is None:
            return Linear(float_weight.to(device=self.device, dtype=self.dtype), bias)
        large = None
        if self.mode == "auto":
            large = Linear(float_weight.to(device=self.device, dtype=self.dtype))
        layer = DispatchLinear(small, large, bias, kind, max_rows=1 << 62)
        self.built.append(layer)
        return layer

    def _small(self, kind: str, weight: torch.Tensor, file_blocks: BlockQuantized | None,
               in_features: int, out_features: int) -> LinearLayer | None:
        if self.mode == "auto":
            if file_blocks is None:
                return None
            if not int4_supported(in_features, out_features):
                return Int8Linear(weight, self.dtype)
            if file_blocks.bits == 4:
                return Int4Linear(file_blocks, self.dtype)
            # 8-bit blocks (a Q8_0 LM head): grouped int8 keeps the file's numbers and ran
            # faster at 1-2 rows than torch's per-channel int8 (docs/BENCHMARKS.md section 9)
            return GroupInt8Linear(file_blocks, self.dtype)
        if not int4_supported(in_features, out_features):
            return Int8Linear(weight, self.dtype)
        four_bit = file_blocks if file_blocks is not None and file_blocks.bits == 4 else None
        if self.mode == "int4" and (kind != "lm_head" or four_bit is not None):
            return Int4Linear(four_bit if four_bit is not None else quantize_int4_blocks(weight),
                              self.dtype)
        return GroupInt8Linear(file_blocks if file_blocks is not None
                               else quantize_int8_blocks(weight), self.dtype)


# A quantized kernel keeps a row count only if it is at least this much faster than the float
# path there (median of the rounds); near a tie the float path runs: it is the exact one, and a
# choice decided by noise would differ from one tuning to the next.
TUNE_MARGIN = 0.10
TUNE_ROUNDS = 5
# Each path of a kind is timed over at least this many layer calls per row count: 5 rounds of
# a kind with 30 layers, 150 rounds of the single LM head (5 calls of one 2-ms layer decided
# the LM head's kernel by noise: 1.9 vs 1.7 ms in one tuning, 1.3 vs 1.6 ms in a quiet run).
TUNE_MIN_CALLS = 150
NOISY_SPREAD = 0.5
TUNE_RULE = (f"median of {TUNE_ROUNDS}+ rounds, >= {TUNE_MIN_CALLS} calls, quantized if >= "
             f"{TUNE_MARGIN:.0%} faster, rows {TUNE_ROWS}")


@dataclass(frozen=True, slots=True)
class DispatchChoice:
    kind: str
    kernel: str  # "int4" / "int8"
    max_rows: int  # 0: never the quantized kernel
    timings_us: dict[int, tuple[float, float]]  # rows -> (quantized, float) medians, us
    # The largest spread (_spread) of one path's rounds at one row count: above NOISY_SPREAD
    # the machine was busy while timing (the plan is cached with a warning).
    spread: float = 0.0


def dispatch_groups(layers: Sequence[DispatchLinear]) -> dict[str, list[DispatchLinear]]:
    """The layers that have both paths, by kind (in order of first appearance)."""
    by_kind: dict[str, list[DispatchLinear]] = {}
    for layer in layers:
        if layer.small is not None and layer.large is not None:
            by_kind.setdefault(layer.kind, []).append(layer)
    return by_kind


def kernel_name(layer: DispatchLinear) -> str:
    if isinstance(layer.small, GroupInt8Linear):
        return "int8g"
    return "int4" if isinstance(layer.small, Int4Linear) else "int8"


def tune_dispatch(layers: Sequence[DispatchLinear], rounds: int = TUNE_ROUNDS,
                  clock: Callable[[], float] = time.perf_counter,
                  margin: float = TUNE_MARGIN,
                  min_calls: int = TUNE_MIN_CALLS) -> list[DispatchChoice]:
    """Choose `max_rows` of every layer that has both paths, per kind, by timing both, and set it.

    For each kind and row count one pass runs the kind's layer of every decoder layer (so the
    weights stream from memory as in a real step, not from cache); `rounds` interleaved passes
    of each path (more for a kind of few layers, so that each path makes `min_calls` layer
    calls), compared by their medians. The quantized kernel keeps the row counts up to the
    first one where it is not at least `margin` faster.
    """
    choices = []
    for kind, group in dispatch_groups(layers).items():
        small_fns: list[LinearLayer] = [layer.small for layer in group if layer.small is not None]
        large_fns: list[LinearLayer] = [layer.large for layer in group if layer.large is not None]
        timings: dict[int, tuple[float, float]] = {}
        max_rows, spread = 0, 0.0
        kind_rounds = max(rounds, -(-min_calls // len(group)))
        for rows in TUNE_ROWS:
            x = torch.randn(rows, group[0].in_features).to(_dtype_of(group[0]))
            _pass(small_fns, x, clock), _pass(large_fns, x, clock)  # warm-up: first-call costs
            small_times, large_times = [], []
            for _ in range(kind_rounds):
                small_times.append(_pass(small_fns, x, clock))
                large_times.append(_pass(large_fns, x, clock))
            small_time, large_time = statistics.median(small_times), statistics.median(large_times)
            timings[rows] = (small_time * 1e6, large_time * 1e6)
            spread = max(spread, _spread(small_times), _spread(large_times))
            if small_time > large_time * (1 - margin):
                break
            max_rows = rows
        choices.append(DispatchChoice(kind, kernel_name(group[0]), max_rows, timings, spread))
    apply_plan(layers, {c.kind: c.max_rows for c in choices})
    return choices


def _spread(times: list[float]) -> float:
    """How far one path's rounds disagree: (second largest - second smallest) / median, so a
    single outlier (an interrupt, a page fault) does not count, a busy machine does."""
    ordered = sorted(times)
    if len(ordered) >= 4:
        ordered = ordered[1:-1]
    median = statistics.median(times)
    return (ordered[-1] - ordered[0]) / median if median > 0 else 0.0


def apply_plan(layers: Sequence[DispatchLinear], plan: dict[str, int]) -> None:
    """Set each two-path layer's `max_rows` from `plan` (kind -> the largest row count that
    runs the quantized kernel; 0 frees the quantized kernel)."""
    for kind, group in dispatch_groups(layers).items():
        if kind not in plan:
            raise ValueError(f"the kernel plan has no entry for {kind}")
        max_rows = plan[kind]
        for layer in group:
            if max_rows == 0:
                layer.drop_small()
            else:
                layer.max_rows = max_rows if max_rows < TUNE_ROWS[-1] else 1 << 62


def _dtype_of(layer: DispatchLinear) -> torch.dtype:
    assert layer.large is not None
    return layer.large.dtype


def _pass(fns: Sequence[LinearLayer], x: torch.Tensor, clock: Callable[[], float]) -> float:
    start = clock()
    for fn in fns:
        fn(x)
    return clock() - start


def linear_weight_bytes(layer: LinearLayer, rows: int) -> int:
    """Bytes of weights a layer reads for a step of `rows` rows."""
    if isinstance(layer, DispatchLinear):
        if layer.small is not None and (layer.large is None or rows <= layer.max_rows):
            return linear_weight_bytes(layer.small, rows)
        assert layer.large is not None
        return linear_weight_bytes(layer.large, rows)
    if isinstance(layer, (Int4Linear, Int8Linear, GroupInt8Linear)):
        return layer.weight_bytes
    return layer.in_features * layer.out_features * _dtype_bytes(layer)


def _dtype_bytes(layer: LinearLayer) -> int:
    dtype = getattr(layer, "dtype", torch.float32)
    return torch.empty((), dtype=dtype).element_size()


def describe(choices: Sequence[DispatchChoice]) -> str:
    """One line: which kernel runs up to how many rows, per kind."""
    return describe_plan({c.kind: c.max_rows for c in choices},
                         {c.kind: c.kernel for c in choices})


def describe_plan(plan: dict[str, int], kernels: dict[str, str]) -> str:
    parts = []
    for kind, max_rows in plan.items():
        if max_rows == 0:
            parts.append(f"{kind}: float")
        elif max_rows >= TUNE_ROWS[-1]:
            parts.append(f"{kind}: {kernels[kind]} at <= {TUNE_ROWS[-1]}+ rows")
        else:
            parts.append(f"{kind}: {kernels[kind]} at <= {max_rows} rows")
    return "; ".join(parts)
