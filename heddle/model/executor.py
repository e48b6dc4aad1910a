"""ModelExecutor: runs a real forward pass and samples, one scheduler step at a time."""

from __future__ import annotations

import time

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import ExecutorOutput, ScheduledRequest, SchedulerOutput, TokenLogprobs
from heddle.errors import HeddleError
from heddle.model.attention_metadata import build_attention_metadata
from heddle.model.device import resolve_device, resolve_dtype
from heddle.model.llama import LlamaForCausalLM
from heddle.model.loader import load_model
from heddle.model.sampler import Sampler, SamplingRow
from heddle.model.spec import ModelSpec
from heddle.model.tokenizer import Tokenizer


class ModelExecutor:
    """Owns the network, the paged KV cache and the sampler.

    The KV cache of layer i is `kv_caches[i]`: [2 (K, V), num_kv_heads, num_blocks, block_size,
    head_dim] in the model's dtype (see heddle.model.attention for the layout).
    """

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, *,
                 use_decode_kernel: bool = True) -> None:
        """`use_decode_kernel=False` forces the plain-torch attention (the C decode kernel is
        otherwise used for float32 on CPU when it builds; see heddle.model.kernels)."""
        self.device = resolve_device(model_config.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        if model_config.num_threads:
            torch.set_num_threads(model_config.num_threads)
        loaded = load_model(model_config.model)
        spec = loaded.spec
        self.spec: ModelSpec = spec
        self.model_name = loaded.name
        self.model_path = loaded.path
        self._tokenizer = loaded.tokenizer
        self.max_model_len = spec.max_position_embeddings
        if model_config.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, model_config.max_model_len)
        with torch.inference_mode():
            self.model = LlamaForCausalLM(spec, loaded.weights, dtype=self.dtype,
                                          device=self.device, max_positions=self.max_model_len,
                                          use_decode_kernel=use_decode_kernel)
        loaded.weights.clear()
        self.arch = spec.cost_spec(self.model_name, str(self.dtype).removeprefix("torch."))

        self.block_size = cache_config.block_size
        if cache_config.num_blocks is not None:
            self.num_blocks = cache_config.num_blocks
        else:
            block_bytes = self.arch.kv_bytes_per_token() * self.block_size
            self.num_blocks = int(cache_config.kv_cache_memory_gb * (1 << 30) // block_bytes)
            if self.num_blocks < 1:
                raise HeddleError("kv_cache_memory_gb is too small for one KV block")
        shape = (2, spec.num_kv_heads, self.num_blocks, self.block_size, spec.head_dim)
        # Zeros, not empty: padded gathers read unused slots (masked, but NaN * 0 is NaN).
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(spec.num_layers)]
        backend = self.model.attention
        if backend.decode_kernel is not None and not backend.decode_kernel.supports(
            self.kv_caches[0], spec.num_heads
        ):
            backend.decode_kernel = None
        self.sampler = Sampler(self.device)

    # -- what the engine reads ---------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer | None:
        """None for a Hugging Face directory without tokenizer.json (token ids only)."""
        return self._tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self._tokenizer.eos_token_id if self._tokenizer is not None else None

    # -- one step ----------------------------------------------------------------------------

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        start = time.perf_counter()
        self.sampler.forget(scheduler_output.finished_request_ids)
        scheduled = self._check(scheduler_output)
        if not scheduled:
            return ExecutorOutput({}, time.perf_counter() - start)
        with torch.inference_mode():
            sampled, logprobs = self._run(scheduled)
        return ExecutorOutput(sampled, time.perf_counter() - start, logprobs)

    def _check(self, scheduler_output: SchedulerOutput) -> list[ScheduledRequest]:
        """The requests that compute tokens; a broken contract fails here, not deep in torch."""
        for s in scheduler_output.scheduled:
            if s.sample and not s.token_ids:
                raise ValueError(f"{s.request_id}: cannot sample without computing a token")
            end = s.start_position + len(s.token_ids)
            if end > self.max_model_len:
                raise ValueError(f"{s.request_id}: position {end - 1} is beyond max_model_len "
                                 f"{self.max_model_len}")
            if len(s.block_table) * self.block_size < end:
                raise ValueError(f"{s.request_id}: block table too short for {end} tokens")
            table = s.block_table
            if table and not 0 <= min(table) <= max(table) < self.num_blocks:
                raise ValueError(f"{s.request_id}: block id outside 0..{self.num_blocks - 1}")
        return [s for s in scheduler_output.scheduled if s.token_ids]

    def _forward(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[list[ScheduledRequest], torch.Tensor]:
        """Run the network on the step's tokens.

        Returns the requests in the order their tokens were laid out and the float32 logits
        of the sampling rows [num_sampling, vocab], in that order. Single-token rows come
        first, longest context first: they attend in batched groups of similar length.
        """
        decodes = sorted((s for s in scheduled if len(s.token_ids) == 1),
                         key=lambda s: s.start_position, reverse=True)
        prefills = [s for s in scheduled if len(s.token_ids) > 1]
        ordered = decodes + prefills
        input_ids = torch.tensor([t for s in ordered for t in s.token_ids], dtype=torch.int64)
        metadata, positions = build_attention_metadata(
            decode_positions=[s.start_position for s in decodes],
            decode_block_tables=[s.block_table for s in decodes],
            prefill_starts=[s.start_position for s in prefills],
            prefill_lengths=[len(s.token_ids) for s in prefills],
            prefill_block_tables=[s.block_table for s in prefills],
            block_size=self.block_size,
            num_kv_heads=self.spec.num_kv_heads,
            group=self.spec.num_heads // self.spec.num_kv_heads,
            sliding_window=self.spec.sliding_window,
            dtype=self.dtype,
            device=self.device,
            decode_kernel=self.model.attention.decode_kernel is not None,
        )
        hidden = self.model.forward(input_ids.to(self.device), positions, self.kv_caches, metadata)
        # Logits only for the last token of each request that samples.
        sample_index: list[int] = []
        offset = 0
        for s in ordered:
            offset += len(s.token_ids)
            if s.sample:
                sample_index.append(offset - 1)
        index = torch.tensor(sample_index, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, index))
        return ordered, logits

    def _run(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprobs]]]:
        ordered, logits = self._forward(scheduled)
        rows = [
            SamplingRow(s.request_id, s.sampling_params, s.num_output_tokens, s.eos_token_id)
            for s in ordered if s.sample
        ]
        if not rows:
            return {}, {}
        token_ids, logprobs = self.sampler.sample(logits, rows)
        sampled = {row.request_id: [token] for row, token in zip(rows, token_ids, strict=True)}
        return sampled, {rows[i].request_id: [lp] for i, lp in logprobs.items()}

    def compute_logits(self, scheduler_output: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Run one step like `execute`, but return the float32 logits [vocab] of each sampling
        request instead of sampling (for tests and scoring)."""
        scheduled = self._check(scheduler_output)
        with torch.inference_mode():
            ordered, logits = self._forward(scheduled)
        sampling = [s.request_id for s in ordered if s.sample]
        return {request_id: logits[i] for i, request_id in enumerate(sampling)}
