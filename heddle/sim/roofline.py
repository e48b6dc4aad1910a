"""A roofline cost model: each operator group takes max(compute time, memory time).

    step_time = step_overhead + sum over groups of max(FLOPs / (peak * compute_eff),
                                                       bytes / (bandwidth * memory_eff))

Groups, per layer: the fused QKV projection, prefill attention (FLOPs of each chunk against
its cached prefix), decode attention (the K/V bytes each request reads), the output
projection, the fused gate+up projection, the down projection, elementwise work (norms, RoPE,
activation, residual adds) and, with tensor parallelism, two ring all-reduces. Once per step:
the LM head over the sampled rows only, and the host's token-mask work of each sampling row
under a grammar (`grammar_row_seconds` per constrained row: it runs on the host CPU, so it
does not scale with the accelerator; the default is measured, see GRAMMAR_ROW_SECONDS). All
figures are per device: with tp > 1 the heads, the MLP and the vocabulary are split tp ways.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from heddle.errors import HeddleError
from heddle.model_shape import DTYPE_BYTES, ModelShape
from heddle.sim.cost_model import CostModel, StepShape
from heddle.sim.specs import HardwareSpec, load_hardware_spec, load_model_spec

LAYER_LINEARS = ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_down")
OPERATORS = (
    "qkv_proj", "attn_prefill", "attn_decode", "o_proj", "mlp_up_gate", "mlp_down",
    "elementwise", "tp_all_reduce", "lm_head", "grammar", "overhead",
)  # fmt: skip
# Host seconds of one constrained sampling row (bitmask fill + apply + matcher advance, xgrammar
# on a JSON schema, SmolLM2's 49,152-token vocabulary): heddle.structured.cost.measure_row_cost
# as benchmarks/grammar_overhead.py runs it on the 2-core Xeon of docs/BENCHMARKS.md section 10.
GRAMMAR_ROW_SECONDS = 197e-6  # 18 fill + 174 apply + 5.5 advance (us), 2026-12-01


@dataclass(frozen=True, slots=True)
class Roofline:
    """Turns (FLOPs, bytes) into seconds on one device."""

    flops_per_s: float  # achievable: peak * compute_efficiency
    bytes_per_s: float  # achievable: bandwidth * memory_efficiency

    def time(self, flops: float, num_bytes: float) -> float:
        return max(flops / self.flops_per_s, num_bytes / self.bytes_per_s)


class RooflineCostModel(CostModel):
    def __init__(
        self,
        model: ModelShape | str | Path,
        hardware: HardwareSpec | str | Path,
        tp: int | None = None,
        dtype: str | None = None,
        grammar_row_seconds: float = GRAMMAR_ROW_SECONDS,
    ) -> None:
        if not grammar_row_seconds >= 0:
            raise HeddleError(f"grammar_row_seconds must be >= 0, got {grammar_row_seconds}")
        self.grammar_row_seconds = float(grammar_row_seconds)
        self.model = model if isinstance(model, ModelShape) else load_model_spec(model)
        if dtype is not None:
            if dtype not in DTYPE_BYTES:
                raise HeddleError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
            self.model = replace(self.model, dtype=dtype)
        if not isinstance(hardware, HardwareSpec):
            hardware = load_hardware_spec(hardware)
        self.hardware = hardware
        self.tp = self.model.default_tp if tp is None else tp
        m = self.model
        if self.tp < 1 or m.num_heads % self.tp or m.intermediate_size % self.tp:
            raise HeddleError(
                f"tp={self.tp} must be positive and divide {m.name}'s {m.num_heads} heads "
                f"and intermediate size {m.intermediate_size}"
            )
        hw = self.hardware
        self.roofline = Roofline(
            flops_per_s=hw.flops_for(m.dtype) * hw.compute_efficiency,
            bytes_per_s=hw.memory_bandwidth * hw.memory_efficiency,
        )
        self._kv_heads = max(1, m.num_kv_heads // self.tp)  # KV heads are replicated past tp
        self._by_tokens: dict[int, tuple[float, ...]] = {}
        self._by_sampled: dict[int, float] = {}

    def describe(self) -> str:
        return f"roofline({self.model.name} {self.model.dtype}, {self.hardware.name}, tp={self.tp})"

    # -- linear layers -------------------------------------------------------------------------

    @staticmethod
    def _linear_work(
        num_tokens: int, in_features: int, out_features: int, dtype_bytes: int
    ) -> tuple[float, float]:
        """(FLOPs, bytes) of a [num_tokens, in] x [in, out] matmul: weight, input and output."""
        if num_tokens == 0:
            return (0.0, 0.0)
        flops = 2.0 * num_tokens * in_features * out_features
        elems = in_features * out_features + num_tokens * (in_features + out_features)
        return (flops, float(elems * dtype_bytes))

    def _linear(self, num_tokens: int, in_features: int, out_features: int) -> float:
        work = self._linear_work(num_tokens, in_features, out_features, self.model.dtype_bytes)
        return self.roofline.time(*work)

    def linear_work(self, num_tokens: int) -> dict[str, tuple[float, float]]:
        """(FLOPs, bytes) of each of one layer's four linear operators for `num_tokens` rows."""
        m, tp = self.model, self.tp
        qkv_out = m.q_size // tp + 2 * self._kv_heads * m.head_dim
        shapes = {
            "qkv_proj": (m.hidden_size, qkv_out),
            "o_proj": (m.q_size // tp, m.hidden_size),
            "mlp_up_gate": (m.hidden_size, 2 * m.intermediate_size // tp),
            "mlp_down": (m.intermediate_size // tp, m.hidden_size),
        }
        return {
            name: self._linear_work(num_tokens, n_in, n_out, m.dtype_bytes)
            for name, (n_in, n_out) in shapes.items()
        }

    def linear_times(self, num_tokens: int) -> dict[str, float]:
        """Seconds of each of one layer's four linear operators for `num_tokens` rows."""
        return {name: self.roofline.time(*w) for name, w in self.linear_work(num_tokens).items()}

    # -- attention -----------------------------------------------------------------------------

    def _attention_prefill(self, shape: StepShape) -> float:
        """Causal attention of each chunk over its cached prefix and itself (flash-style)."""
        if not shape.prefill_chunks:
            return 0.0
        m = self.model
        heads = m.num_heads // self.tp
        kv_width = 2 * self._kv_heads * m.head_dim  # K and V elements per token
        flops = 4.0 * shape.prefill_attention_pairs * heads * m.head_dim  # QK^T and PV
        elems = sum(
            n * 2 * heads * m.head_dim  # read Q, write O
            + c * kv_width  # read the K/V of the whole context (new tokens included)
            + n * kv_width  # write the new tokens' K/V into the cache
            for n, c in shape.prefill_chunks
        )
        return self.roofline.time(flops, elems * m.dtype_bytes)

    def _attention_decode(self, shape: StepShape) -> float:
        """One query per request against its whole context: bound by reading the K/V cache."""
        if not shape.num_decode_tokens:
            return 0.0
        m = self.model
        heads = m.num_heads // self.tp
        kv_width = 2 * self._kv_heads * m.head_dim
        context = shape.decode_context_tokens
        flops = 4.0 * context * heads * m.head_dim
        elems = context * kv_width + shape.num_decode_tokens * (2 * heads * m.head_dim + kv_width)
        return self.roofline.time(flops, elems * m.dtype_bytes)

    # -- the rest ------------------------------------------------------------------------------

    def _elementwise(self, num_tokens: int) -> float:
        """Two RMSNorms, RoPE on q and k, SiLU*up, two residual adds: memory-bound passes."""
        m, tp = self.model, self.tp
        per_token = (
            2 * 2 * m.hidden_size  # two norms: read + write
            + 2 * (m.q_size // tp + self._kv_heads * m.head_dim)  # rope: read + write q, k
            + 3 * m.intermediate_size // tp  # act: read gate and up, write one
            + 2 * 3 * m.hidden_size  # two residual adds: read two, write one
        )
        return num_tokens * per_token * m.dtype_bytes / self.roofline.bytes_per_s

    def _all_reduce(self, num_tokens: int) -> float:
        """One ring all-reduce of [num_tokens, hidden] activations across tp devices."""
        if self.tp == 1 or num_tokens == 0:
            return 0.0
        hw = self.hardware
        if hw.interconnect_bandwidth <= 0:
            raise HeddleError(f"hardware {hw.name!r} has no interconnect_bandwidth for tp > 1")
        message = num_tokens * self.model.hidden_size * self.model.dtype_bytes
        ring_bytes = 2 * (self.tp - 1) / self.tp * message  # reduce-scatter + all-gather
        return hw.interconnect_latency + ring_bytes / hw.interconnect_bandwidth

    def _lm_head(self, num_rows: int) -> float:
        """Final norm and the vocabulary projection of the sampled rows; fp32 logits written."""
        if num_rows == 0:
            return 0.0
        m = self.model
        vocab = m.vocab_size // self.tp
        matmul = self._linear(num_rows, m.hidden_size, vocab)
        logits = num_rows * vocab * 4 / self.roofline.bytes_per_s
        return matmul + logits

    def operator_times(self, shape: StepShape) -> dict[str, float]:
        """Seconds of each operator group in the step (all layers), plus the step overhead."""
        times = dict.fromkeys(OPERATORS, 0.0)
        if shape.is_empty:
            return times
        layers = self.model.num_layers
        tokens = shape.num_tokens
        for name, seconds in self.linear_times(tokens).items():
            times[name] = layers * seconds
        times["attn_prefill"] = layers * self._attention_prefill(shape)
        times["attn_decode"] = layers * self._attention_decode(shape)
        times["elementwise"] = layers * self._elementwise(tokens)
        times["tp_all_reduce"] = layers * 2 * self._all_reduce(tokens)
        times["lm_head"] = self._lm_head(shape.num_sampled_rows)
        times["grammar"] = shape.num_constrained * self.grammar_row_seconds
        times["overhead"] = self.hardware.step_overhead
        return times

    def step_time(self, shape: StepShape) -> float:
        """The sum of `operator_times`, in its order (the same float), with the terms that
        depend only on the step's token count or sampled rows cached: a simulator asks this
        for every step."""
        if shape.is_empty:
            return 0.0
        layers = self.model.num_layers
        by_tokens = self._by_tokens.get(shape.num_tokens)
        if by_tokens is None:
            tokens = shape.num_tokens
            linear = self.linear_times(tokens)
            by_tokens = self._by_tokens[tokens] = (
                layers * linear["qkv_proj"],
                layers * linear["o_proj"],
                layers * linear["mlp_up_gate"],
                layers * linear["mlp_down"],
                layers * self._elementwise(tokens),
                layers * 2 * self._all_reduce(tokens),
            )
        lm_head = self._by_sampled.get(shape.num_sampled)
        if lm_head is None:
            lm_head = self._by_sampled[shape.num_sampled] = self._lm_head(shape.num_sampled)
        qkv, o_proj, up_gate, down, elementwise, all_reduce = by_tokens
        return sum(
            (
                qkv,
                layers * self._attention_prefill(shape),
                layers * self._attention_decode(shape),
                o_proj,
                up_gate,
                down,
                elementwise,
                all_reduce,
                lm_head,
                shape.num_constrained * self.grammar_row_seconds,
                self.hardware.step_overhead,
            )
        )


def kv_cache_blocks(
    model: ModelShape | str | Path,
    hardware: HardwareSpec | str | Path,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    tp: int = 1,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
) -> int:
    """KV blocks that fit on one device after its share of the weights and an activation reserve.

    Usable memory is `memory_bytes * gpu_memory_utilization`, less the weights / tp, less the
    activations of a full step of `max_num_batched_tokens` tokens (residual, QKV, gate+up) and
    fp32 logits for `max_num_seqs` rows. Each block holds K and V of `block_size` tokens, all
    layers, this device's KV heads.
    """
    m = model if isinstance(model, ModelShape) else load_model_spec(model)
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware_spec(hardware)
    if block_size < 1 or tp < 1:
        raise HeddleError("block_size and tp must be positive")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise HeddleError("gpu_memory_utilization must be in (0, 1]")
    weights = m.weight_bytes() / tp
    activation_width = 2 * m.hidden_size + (m.q_size + 2 * m.kv_size + 2 * m.intermediate_size) / tp
    reserve = (
        max_num_batched_tokens * activation_width * m.dtype_bytes
        + max_num_seqs * m.vocab_size / tp * 4
    )
    usable = hw.memory_bytes * gpu_memory_utilization - weights - reserve
    block_bytes = block_size * m.kv_bytes_per_token(tp)
    if usable < block_bytes:
        raise HeddleError(
            f"{m.name} ({m.dtype}) does not fit on {hw.name} with tp={tp}: "
            f"{weights / 1e9:.1f} GB of weights and {reserve / 1e9:.1f} GB of activations "
            "per device, "
            f"{hw.memory_bytes * gpu_memory_utilization / 1e9:.1f} GB usable; raise tp"
        )
    return int(usable // block_bytes)
