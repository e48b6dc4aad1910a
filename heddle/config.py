"""Engine configuration: frozen dataclasses, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from heddle.errors import HeddleError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct GGUF
    dtype: str = "auto"  # auto | bfloat16 | float32 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_model_len: int | None = None  # None: the model's own context length
    num_threads: int | None = None  # torch intra-op threads on CPU; None: leave as is
    # auto | none | int8 | int4: weight-only quantized linear layers on CPU
    # (see heddle/model/linear_plan.py; auto keeps a quantized file's own blocks).
    quantization: str = field(default="auto", metadata={"help": (
        "auto | none | int8 | int4: weight-only quantized linear layers on CPU (auto: a "
        "quantized GGUF's own blocks where they are faster, chosen per step size at load)")})
    # auto's kernel plan is timed once per machine and cached (heddle/model/tuning_cache.py);
    # True times it again and overwrites the cached plan.
    retune_kernels: bool = field(default=False, metadata={"help": (
        "time auto's kernels again at load instead of using this machine's cached plan "
        "($HEDDLE_TUNING_CACHE, else ~/.cache/heddle/tuning)")})
    # Every row computes what it would alone, whatever else is in the step (one linear kernel
    # for every row count, 32 rows per call; every token attended by the C decode kernel, one
    # query row at a time, whatever its prompt's chunking or cached prefix:
    # heddle/model/batch_invariant.py): greedy outputs then do not depend on batching, with or
    # without speculation; slower on CPU.
    batch_invariant: bool = field(default=False, metadata={"help": (
        "batch-invariant linears: a row's logits do not depend on what else is in the step, "
        "so greedy outputs are the same at any batch, with or without speculation (slower)")})

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float32", "float16", "bf16", "fp32", "fp16"):
            raise HeddleError(
                f"unknown dtype {self.dtype!r}: use auto, bfloat16, float32 or float16"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise HeddleError(f"unknown device {self.device!r}: use auto, cpu or cuda")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise HeddleError("max_model_len must be positive")
        if self.quantization not in ("auto", "none", "int8", "int4"):
            raise HeddleError(
                f"unknown quantization {self.quantization!r}: use auto, none, int8 or int4"
            )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True
    # The second KV tier, in blocks (heddle/sessions/tier.py): where the retention policy may
    # move paused sessions' KV (host memory beside a GPU pool, a buffer outside the pool on
    # CPU); 0: none.
    offload_blocks: int = 0
    # The prefix cache's block hash (heddle/core/block_hash.py): "sha256" (safe against
    # crafted prompts), or "builtin" (Python's tuple hash, cheaper; the simulator's).
    block_hash: Literal["sha256", "builtin"] = "sha256"

    def __post_init__(self) -> None:
        if self.block_hash not in ("sha256", "builtin"):
            raise HeddleError(f"block_hash must be sha256 or builtin, got {self.block_hash!r}")
        if self.offload_blocks < 0:
            raise HeddleError("offload_blocks must be >= 0")
        if self.block_size < 1:
            raise HeddleError("block_size must be positive")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise HeddleError("num_blocks must be positive")
        if self.kv_cache_memory_gb <= 0:
            raise HeddleError("kv_cache_memory_gb must be positive")


SPECULATION_METHODS = ("off", "ngram", "draft", "sim")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding (heddle/spec/): who proposes draft tokens, and how many.

    `method`: off; ngram (prompt lookup, no extra model); draft (a smaller model that shares
    the target's tokenizer, `model`: its GGUF file or HF directory; the scheduler grants draft
    slots, the executor's draft model fills them in the same step); sim (the simulator: every
    decode is offered drafts, the simulated executor accepts each one, given the ones before
    it, with a per-request rate drawn uniformly in `acceptance` +- `acceptance_spread`, in
    `proposal_rate` of its decode steps).
    `adaptive`: each request gets 0..num_draft_tokens drafts per step from a goodput estimate
    (heddle/spec/adaptive.py); False: always num_draft_tokens where a proposal has them.
    """

    method: str = "off"
    num_draft_tokens: int = 4  # the most drafts a request gets in a step
    adaptive: bool = True
    ngram_min: int = 2
    ngram_max: int = 4
    model: str | None = None  # method=draft: the draft model
    # method=sim: the mean rate at which a draft is accepted (given the earlier ones were) and
    # the spread of the per-request rates; docs/SPECULATION.md has the rates fitted to the real
    # engine's runs (heddle/spec/sim.py: MEASURED_ACCEPTANCE).
    acceptance: float = 0.7
    acceptance_spread: float = 0.2
    # method=sim: the share of decode steps a request has a proposal in (prompt lookup finds
    # no match in the others; a draft model always proposes: 1).
    proposal_rate: float = 1.0

    def __post_init__(self) -> None:
        if self.method not in SPECULATION_METHODS:
            raise HeddleError(
                f"unknown speculation method {self.method!r}: use {', '.join(SPECULATION_METHODS)}"
            )
        if self.num_draft_tokens < 1:
            raise HeddleError("num_draft_tokens must be positive")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise HeddleError("need 1 <= ngram_min <= ngram_max")
        if self.method == "draft" and not self.model:
            raise HeddleError("speculation method=draft needs model=PATH (the draft model)")
        if self.model is not None and self.method != "draft":
            raise HeddleError(f"a draft model is only used with method=draft, not {self.method}")
        if not all(0.0 <= x <= 1.0 for x in (self.acceptance, self.acceptance_spread,
                                               self.proposal_rate)):
            raise HeddleError("acceptance, acceptance_spread and proposal_rate must be within "
                              "0 .. 1")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512  # token budget of one step
    max_num_seqs: int = 64  # cap on running requests
    policy: str = "fcfs"
    policy_options: dict[str, object] = field(default_factory=dict)
    max_waiting: int | None = None  # bound on the waiting queue; None: unbounded
    # Refuse at arrival what cannot be served in time (heddle/core/admission.py): off|slo|queue.
    admission: Literal["off", "slo", "queue"] = "off"
    admission_options: dict[str, object] = field(default_factory=dict)
    # The preemption guard (heddle/core/preemption_guard.py): tokens preemption may throw
    # away per token computed over a window of about this many seconds; None: no bound.
    max_recompute_ratio: float | None = 0.1
    recompute_window_seconds: float = 20.0
    # Longest prefill chunk one request may take in a step; None: the whole budget.
    long_prefill_token_threshold: int | None = None
    # What happens to a paused agent session's KV (heddle/sessions/retention.py): lru (not
    # parked: today's engines), ttl (a fixed pin), cost (keep / drop by the cost model).
    retention: str = "lru"
    retention_options: dict[str, object] = field(default_factory=dict)
    max_park_seconds: float = 600.0  # no parked KV outlives this
    # Decision events (heddle/core/events.py): the ring buffer's size; 0 turns them off.
    decision_events: int = 65_536
    speculation: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __post_init__(self) -> None:
        if self.decision_events < 0:
            raise HeddleError("decision_events must be >= 0 (0 turns them off)")
        if self.max_num_batched_tokens < 1:
            raise HeddleError("max_num_batched_tokens must be positive")
        if self.max_num_seqs < 1:
            raise HeddleError("max_num_seqs must be positive")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise HeddleError("max_waiting must be >= 0")
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 1:
            raise HeddleError("long_prefill_token_threshold must be positive")
        if not self.max_park_seconds > 0:
            raise HeddleError("max_park_seconds must be positive")
        if self.max_recompute_ratio is not None and not self.max_recompute_ratio >= 0:
            raise HeddleError(
                f"max_recompute_ratio must be >= 0 or None, got {self.max_recompute_ratio}"
            )
        if not self.recompute_window_seconds > 0:
            raise HeddleError("recompute_window_seconds must be positive")
        if self.admission not in ("off", "slo", "queue"):
            raise HeddleError(f"unknown admission {self.admission!r}: use off, slo or queue")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0
