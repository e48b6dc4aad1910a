"""Check the roofline's linear-layer times against measured GPU operator profiles.

`shared/gpu-profiles/` holds median times of Llama-family linear layers on H100 and A100 by
token count and tensor-parallel degree (Vidur's published profiles). The roofline predicts the
same four operators from the model's shape and the hardware spec; this module pairs them up,
reports relative error by token-count bucket, and fits the spec's two efficiency factors.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from heddle.model_shape import ModelShape
from heddle.sim.roofline import RooflineCostModel
from heddle.sim.specs import HardwareSpec, load_hardware_spec

# measured column -> roofline operator
OPERATOR_COLUMNS = {
    "attn_pre_proj": "qkv_proj",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "mlp_up_gate",
    "mlp_down_proj": "mlp_down",
}
# profile file -> (hardware id, model name)
PROFILE_FILES = {
    "h100_llama-2-7b_linear_ops.csv": ("h100", "llama-2-7b"),
    "h100_llama-2-70b_linear_ops.csv": ("h100", "llama-2-70b"),
    "a100_llama-2-7b_linear_ops.csv": ("a100", "llama-2-7b"),
    "a100_llama-3-8b_linear_ops.csv": ("a100", "llama-3-8b"),
}
TOKEN_BUCKETS = ((1, 8), (9, 64), (65, 256), (257, 1024), (1025, 4096), (4097, 32768))


def shared_dir() -> Path | None:
    """`$HEDDLE_SHARED` when set, else `shared/` beside the repository root; None if missing."""
    env = os.environ.get("HEDDLE_SHARED")
    path = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared"
    return path if path.is_dir() else None


def profiles_dir() -> Path | None:
    shared = shared_dir()
    if shared is None or not (shared / "gpu-profiles").is_dir():
        return None
    return shared / "gpu-profiles"


@dataclass(frozen=True, slots=True)
class MeasuredOp:
    model: ModelShape  # one layer of the profiled model (num_layers=1)
    operator: str  # roofline operator name
    num_tokens: int
    tp: int
    seconds: float  # median over the profile's rows for this (tokens, tp)


@dataclass(frozen=True, slots=True)
class Comparison:
    measured: MeasuredOp
    predicted: float  # seconds

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured: positive means the roofline is too slow."""
        return (self.predicted - self.measured.seconds) / self.measured.seconds


def load_linear_profile(path: Path, model_name: str) -> list[MeasuredOp]:
    """The median time of each linear operator at each (num_tokens, tp) in one profile CSV."""
    grouped: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    model: ModelShape | None = None
    with path.open() as f:
        for row in csv.DictReader(f):
            if model is None:
                hidden, heads = int(row["n_embd"]), int(row["n_head"])
                model = ModelShape(
                    name=model_name,
                    num_layers=1,
                    hidden_size=hidden,
                    num_heads=heads,
                    num_kv_heads=int(row["n_kv_head"]),
                    head_dim=hidden // heads,
                    intermediate_size=int(row["n_expanded_embd"]),
                    vocab_size=int(row["vocab_size"]),
                    dtype="float16",
                )
            key_tail = (int(row["num_tokens"]), int(row["num_tensor_parallel_workers"]))
            for column, operator in OPERATOR_COLUMNS.items():
                ms = float(row[f"time_stats.{column}.median"])
                grouped[(operator, *key_tail)].append(ms * 1e-3)
    if model is None:
        raise ValueError(f"{path} has no rows")
    return [
        MeasuredOp(model, operator, num_tokens, tp, statistics.median(times))
        for (operator, num_tokens, tp), times in sorted(grouped.items())
    ]


def load_profiles(directory: Path, hardware_id: str) -> list[MeasuredOp]:
    """Every measured linear operator for one hardware id, across its profile files."""
    ops: list[MeasuredOp] = []
    for name, (hw, model_name) in PROFILE_FILES.items():
        if hw == hardware_id and (directory / name).is_file():
            ops.extend(load_linear_profile(directory / name, model_name))
    return ops


def compare(hardware: HardwareSpec, measured: Iterable[MeasuredOp]) -> list[Comparison]:
    models: dict[tuple[str, int], RooflineCostModel] = {}
    linear_times: dict[tuple[str, int, int], dict[str, float]] = {}
    out = []
    for op in measured:
        key = (op.model.name, op.tp)
        if key not in models:
            models[key] = RooflineCostModel(op.model, hardware, tp=op.tp)
        times_key = (*key, op.num_tokens)
        if times_key not in linear_times:
            linear_times[times_key] = models[key].linear_times(op.num_tokens)
        out.append(Comparison(op, linear_times[times_key][op.operator]))
    return out


def bucket_of(num_tokens: int) -> tuple[int, int]:
    for low, high in TOKEN_BUCKETS:
        if low <= num_tokens <= high:
            return (low, high)
    raise ValueError(f"{num_tokens} tokens is outside every bucket")


def error_table(comparisons: Sequence[Comparison]) -> dict[tuple[int, int], dict[str, float]]:
    """bucket -> operator (and "all") -> median absolute relative error."""
    cells: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in comparisons:
        cell = cells[bucket_of(c.measured.num_tokens)]
        cell[c.measured.operator].append(abs(c.relative_error))
        cell["all"].append(abs(c.relative_error))
    return {
        bucket: {op: statistics.median(errs) for op, errs in by_op.items()}
        for bucket, by_op in sorted(cells.items())
    }


def median_abs_error(comparisons: Iterable[Comparison], min_tokens: int = 1) -> float:
    errs = [abs(c.relative_error) for c in comparisons if c.measured.num_tokens >= min_tokens]
    return statistics.median(errs)


def balanced_error(comparisons: Sequence[Comparison]) -> float:
    """The mean over token-count buckets of each bucket's median absolute relative error.

    Profiles sample large token counts far more densely than small ones; weighting each
    bucket equally keeps the memory-bound regime from being outvoted.
    """
    table = error_table(comparisons)
    return statistics.fmean(row["all"] for row in table.values())


def calibrate(
    hardware: HardwareSpec, measured: Sequence[MeasuredOp], max_tp: int = 1
) -> HardwareSpec:
    """The spec with the (compute, memory) efficiency pair, on a 0.01 grid from 0.30 to 1.00,
    that minimises `balanced_error` over all measured operators with tp <= max_tp.

    One pair per hardware, shared by every model, operator and token count. Each operator's
    time is max(a / compute_eff, b / memory_eff) with a and b fixed by the spec's peaks, so
    the whole grid is evaluated at once.
    """
    rows = [m for m in measured if m.tp <= max_tp]
    peak = replace(hardware, compute_efficiency=1.0, memory_efficiency=1.0)
    at_peak: dict[tuple[str, int], RooflineCostModel] = {}
    compute_s, memory_s = [], []
    for op in rows:
        key = (op.model.name, op.tp)
        if key not in at_peak:
            at_peak[key] = RooflineCostModel(op.model, peak, tp=op.tp)
        model = at_peak[key]
        flops, num_bytes = model.linear_work(op.num_tokens)[op.operator]
        compute_s.append(flops / model.roofline.flops_per_s)
        memory_s.append(num_bytes / model.roofline.bytes_per_s)
    measured_s = np.array([op.seconds for op in rows])
    buckets = [np.array([bucket_of(op.num_tokens) == b for op in rows]) for b in TOKEN_BUCKETS]
    buckets = [mask for mask in buckets if mask.any()]
    grid = np.arange(30, 101) / 100
    compute_at_peak, memory_at_peak = np.array(compute_s), np.array(memory_s)
    memory_times = memory_at_peak[None, :] / grid[:, None]  # [memory_eff, row]
    balanced = np.empty((len(grid), len(grid)))  # [compute_eff, memory_eff]
    for i, compute_eff in enumerate(grid):
        predicted = np.maximum(compute_at_peak / compute_eff, memory_times)
        errors = np.abs(predicted - measured_s) / measured_s
        balanced[i] = np.mean([np.median(errors[:, mask], axis=1) for mask in buckets], axis=0)
    best_compute, best_memory = np.unravel_index(np.argmin(balanced), balanced.shape)
    return replace(
        hardware,
        compute_efficiency=float(grid[best_compute]),
        memory_efficiency=float(grid[best_memory]),
    )


def check_hardware(hardware_id: str, directory: Path, max_tp: int = 1) -> list[Comparison]:
    """Comparisons of the shipped spec against every profile of that hardware with tp <= max_tp."""
    hardware = load_hardware_spec(hardware_id)
    return compare(hardware, [m for m in load_profiles(directory, hardware_id) if m.tp <= max_tp])
