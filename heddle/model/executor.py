"""ModelExecutor: runs a real forward pass and samples, one scheduler step at a time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.core.outputs import ExecutorOutput, SchedulerOutput, TokenLogprobs
from heddle.errors import HeddleError
from heddle.model.attention_metadata import build_attention_metadata
from heddle.model.batch_invariant import make_batch_invariant
from heddle.model.device import resolve_device, resolve_dtype
from heddle.model.llama import LlamaForCausalLM
from heddle.model.loader import load_model
from heddle.model.sampler import Sampler, SamplingRow, apply_token_bitmask
from heddle.model.spec import ModelSpec
from heddle.model.tier import HostTier
from heddle.model.tokenizer import Tokenizer
from heddle.request import SamplingParams
from heddle.sessions.draft_kv import DraftSessions
from heddle.spec.rejection import verify

if TYPE_CHECKING:
    from heddle.spec.draft import DraftModelProposer


# A verify row longer than this (known tokens + drafts) runs as a prefill chunk: each decode
# row reads its whole context, so a long chunk is cheaper through SDPA.
MAX_DECODE_PATH_TOKENS = 17


class ModelExecutor:
    """Owns the network, the paged KV cache and the sampler.

    The KV cache of layer i is `kv_caches[i]`: [2 (K, V), num_kv_heads, num_blocks, block_size,
    head_dim] in the model's dtype (see heddle.model.attention for the layout).
    """

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, *,
                 use_decode_kernel: bool = True,
                 float_kinds: frozenset[str] = frozenset()) -> None:
        """`use_decode_kernel=False` forces the plain-torch attention (the C decode kernel is
        otherwise used for float32 on CPU when it builds; see heddle.model.kernels).
        `float_kinds`: linear kinds kept unquantized (heddle.model.linear_plan.LinearBuilder)."""
        self.device = resolve_device(model_config.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        if model_config.num_threads:
            torch.set_num_threads(model_config.num_threads)
        loaded = load_model(model_config.model,
                            keep_blocks=model_config.quantization != "none")
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
                                          use_decode_kernel=use_decode_kernel,
                                          quantization=model_config.quantization,
                                          blocks=loaded.blocks, float_kinds=float_kinds)
            self.quantization = self.model.tune_linears(model_config.retune_kernels)
        self.batch_invariant = model_config.batch_invariant
        if self.batch_invariant:
            make_batch_invariant(self.model)
            self.quantization += ", batch-invariant"
        loaded.weights.clear()
        loaded.blocks.clear()
        self.model_shape = spec.shape(self.model_name, str(self.dtype).removeprefix("torch."))

        self.block_size = cache_config.block_size
        if cache_config.num_blocks is not None:
            self.num_blocks = cache_config.num_blocks
        else:
            block_bytes = self.model_shape.kv_bytes_per_token() * self.block_size
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
        if self.batch_invariant and backend.decode_kernel is None:
            raise HeddleError(
                "batch_invariant needs the C decode attention (a CPU float32 or bfloat16 "
                "model with a C compiler): every token is attended by it, one row at a time")
        self.sampler = Sampler(self.device)
        self.tier = HostTier.for_caches(self.kv_caches, cache_config.offload_blocks)
        # Per request id: its tokens, block table and sampling parameters (the contract sends
        # them once, then only what changes).
        self._requests: dict[str, _RequestState] = {}
        # Speculation with a draft model (heddle/spec/draft.py, `attach_draft_model`): it fills
        # the draft slots the scheduler granted, in this step, before the forward pass.
        self.draft: DraftModelProposer | None = None
        self.draft_sessions = DraftSessions()  # paused sessions' draft KV (sessions/draft_kv.py)
        # Verify rows through the decode attention (False: as prefill chunks, the path before;
        # benchmarks/spec_verify_step.py times both).
        self.verify_on_decode_path = True
        # ... with the kernels of the step's rows without their drafts (_kernels_without_drafts).
        self.verify_kernels_as_decode = True

    # -- what the engine reads ---------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer | None:
        """None for a Hugging Face directory without tokenizer.json (token ids only)."""
        return self._tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self._tokenizer.eos_token_id if self._tokenizer is not None else None

    @property
    def has_tier(self) -> bool:
        return self.tier is not None

    def attach_tier(self, num_blocks: int) -> None:
        """A second KV tier of `num_blocks` blocks (0: none), replacing any before."""
        self.tier = HostTier.for_caches(self.kv_caches, num_blocks)

    def tier_copy_seconds(self, num_blocks: int) -> float:
        """One way: seconds to copy `num_blocks` blocks to the second tier (or back), at the
        bandwidth its copies have reached so far."""
        if self.tier is None:
            raise HeddleError("this executor has no second KV tier")
        return num_blocks * self.tier.block_bytes / self.tier.bandwidth

    # -- one step ----------------------------------------------------------------------------

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        start = time.perf_counter()
        so = scheduler_output
        if so.offload_blocks or so.restore_blocks:
            if self.tier is None:
                raise ValueError("the step copies to the second KV tier, but there is none")
            self.tier.copy(self.kv_caches, so.offload_blocks, so.restore_blocks)
        rows = self._rows(scheduler_output)
        if not any(row.token_ids for row in rows):
            return ExecutorOutput([() for _ in rows], time.perf_counter() - start)
        with torch.inference_mode():
            sampled, logprobs = self._run(rows, scheduler_output)
        return ExecutorOutput(sampled, time.perf_counter() - start, logprobs)

    def _rows(self, scheduler_output: SchedulerOutput) -> list[_Row]:
        """Apply the step's changes to the per-request state and lay out its rows; a broken
        contract fails here, not deep in torch."""
        so = scheduler_output
        states = self._requests
        self.sampler.forget(so.finished_request_ids)
        for request_id in so.finished_request_ids:
            states.pop(request_id, None)
        for request_id in so.preempted_request_ids:
            states.pop(request_id, None)  # it comes back as a new request (its sampler stays)
        if self.draft is not None:  # the draft model's K/V goes with the request's ...
            if so.draft_session_orders:  # ... unless its session keeps it while paused
                self.draft_sessions.apply(so.draft_session_orders, self.draft)
            self.draft.forget(so.finished_request_ids)
            self.draft.forget(so.preempted_request_ids)
        for new in so.new_requests:
            states[new.request_id] = _RequestState(
                list(new.token_ids), new.num_prompt_tokens, list(new.block_ids),
                new.sampling_params, new.eos_token_id,
            )  # fmt: skip
        for request_id, block_ids in so.new_block_ids.items():
            states[request_id].block_table.extend(block_ids)
        rows = []
        for request_id, start, num_new, sample in zip(
            so.request_ids, so.num_computed_tokens, so.num_new_tokens, so.sample, strict=True
        ):
            state = states.get(request_id)
            if state is None:
                raise ValueError(f"{request_id}: scheduled but never sent as a new request")
            drafts = so.draft_token_ids.get(request_id)
            num_drafts = len(drafts) if drafts else 0
            token_ids = state.token_ids[start : start + num_new - num_drafts]
            if drafts:
                token_ids += drafts
            if len(token_ids) != num_new:
                raise ValueError(f"{request_id}: {num_new} tokens scheduled from position "
                                 f"{start}, {len(token_ids)} known")
            if sample and not token_ids:
                raise ValueError(f"{request_id}: cannot sample without computing a token")
            end = start + num_new
            if end > self.max_model_len:
                raise ValueError(f"{request_id}: position {end - 1} is beyond max_model_len "
                                 f"{self.max_model_len}")
            table = state.block_table
            if len(table) * self.block_size < end:
                raise ValueError(f"{request_id}: block table too short for {end} tokens")
            if table and not 0 <= min(table) <= max(table) < self.num_blocks:
                raise ValueError(f"{request_id}: block id outside 0..{self.num_blocks - 1}")
            rows.append(_Row(request_id, token_ids, start, sample, state, num_drafts))
        if self.draft is not None and so.draft_token_ids:
            self._draft(rows)
        return rows

    def _draft(self, rows: list[_Row]) -> None:
        """Fill the draft slots with the draft model's proposals (all rows batched in each
        draft step); a row it has no proposal for (its draft cache is full) computes only its
        known token, and the scheduler counts its slots as rejected drafts."""
        from heddle.spec.draft import ProposalRequest

        assert self.draft is not None
        wanted = [r for r in rows if r.num_drafts]
        requests = [
            ProposalRequest(r.request_id, r.state.token_ids, r.num_drafts,
                            r.state.sampling_params, r.state.num_prompt_tokens)
            for r in wanted
        ]  # fmt: skip
        if self.draft_sessions.parked:  # paused sessions' draft KV gives way to proposals
            self.draft_sessions.make_room(self.draft.blocks_wanted(requests), self.draft)
        with torch.inference_mode():
            proposals = self.draft.propose(requests)
        for r in wanted:
            proposal = proposals.get(r.request_id)
            drafts = proposal.token_ids[: r.num_drafts] if proposal is not None else []
            del r.token_ids[len(r.token_ids) - r.num_drafts :]
            r.token_ids.extend(drafts)
            r.num_drafts = len(drafts)
            r.draft_probs = proposal.probs if proposal is not None and drafts else None

    def _forward(self, rows: list[_Row]) -> tuple[list[_Row], torch.Tensor]:
        """Run the network on the step's tokens.

        Returns the rows in the order their tokens were laid out and the float32 logits of
        the sampling rows [num_sampling, vocab], in that order (a row with k draft tokens has
        k + 1: its last k + 1 positions). Single-token rows come first, longest context first:
        they attend in batched groups of similar length.
        """
        computing = [r for r in rows if r.token_ids]
        decodes = sorted((r for r in computing if self._on_decode_path(r)),
                         key=lambda r: r.start_position, reverse=True)
        prefills = [r for r in computing if not self._on_decode_path(r)]
        ordered = decodes + prefills
        input_ids = torch.tensor([t for r in ordered for t in r.token_ids], dtype=torch.int64)
        # A verify row (its known token and k drafts) runs as k + 1 decode rows that share its
        # block table, query j at position start + j: the decode kernel attends each over its
        # context up to itself (the step's K/V are stored first), so causal masking falls out
        # of the context lengths, as for k + 1 requests decoding side by side.
        metadata, positions = build_attention_metadata(
            decode_positions=[r.start_position + j for r in decodes
                              for j in range(len(r.token_ids))],
            decode_block_tables=[r.state.block_table for r in decodes for _ in r.token_ids],
            prefill_starts=[r.start_position for r in prefills],
            prefill_lengths=[len(r.token_ids) for r in prefills],
            prefill_block_tables=[r.state.block_table for r in prefills],
            block_size=self.block_size,
            num_kv_heads=self.spec.num_kv_heads,
            group=self.spec.num_heads // self.spec.num_kv_heads,
            sliding_window=self.spec.sliding_window,
            dtype=self.dtype,
            device=self.device,
            decode_kernel=self.model.attention.decode_kernel is not None,
        )
        num_drafts = sum(r.num_drafts for r in ordered)
        with self._kernels_without_drafts(len(input_ids), num_drafts):
            hidden = self.model.forward(input_ids.to(self.device), positions, self.kv_caches,
                                        metadata)
        # Logits only for the last token of each request that samples.
        sample_index: list[int] = []
        offset = 0
        for r in ordered:
            offset += len(r.token_ids)
            if r.sample:
                if r.num_drafts:
                    sample_index.extend(range(offset - 1 - r.num_drafts, offset))
                else:
                    sample_index.append(offset - 1)
        if len(sample_index) != offset:  # not every row samples: gather those that do
            index = torch.tensor(sample_index, dtype=torch.int64, device=self.device)
            hidden = hidden.index_select(0, index)
        with self._kernels_without_drafts(len(sample_index), num_drafts):
            logits = self.model.compute_logits(hidden)
        return ordered, logits

    @contextlib.contextmanager
    def _kernels_without_drafts(self, num_rows: int, num_drafts: int) -> Iterator[None]:
        """With `verify_kernels_as_decode`, the linears of a step with drafts run the kernels
        the step would run without them (quantization auto chooses a kernel by the row count:
        a 1-row decode runs int4, the same row with 4 drafts would run bf16, slower where it
        streams more weight bytes, and with other rounding: greedy outputs could differ)."""
        layers = self.model.linears.built
        if not (num_drafts and self.verify_kernels_as_decode and layers):
            yield
            return
        without = num_rows - num_drafts
        raised = [(layer, layer.max_rows) for layer in layers
                  if layer.small is not None and layer.large is not None
                  and without <= layer.max_rows < num_rows]
        for layer, _ in raised:
            layer.max_rows = num_rows
        try:
            yield
        finally:
            for layer, max_rows in raised:
                layer.max_rows = max_rows

    def _on_decode_path(self, row: _Row) -> bool:
        """One token, or a verify row (a few known tokens and its drafts) when
        `verify_on_decode_path`: attended by the decode kernel, not as a prefill chunk.
        Batch-invariant: every row, prefill chunks too (each token attends through the decode
        kernel over its context up to itself, one query row at a time, so its result does not
        depend on how its prompt was chunked or which of it came from the prefix cache; and
        every step is decode-only, so every row runs the same layers, the fused ones where
        the model has them)."""
        if len(row.token_ids) == 1 or self.batch_invariant:
            return True
        return (self.verify_on_decode_path and row.num_drafts > 0
                and len(row.token_ids) <= MAX_DECODE_PATH_TOKENS)

    def _run(
        self, rows: list[_Row], scheduler_output: SchedulerOutput
    ) -> tuple[list[Sequence[int]], dict[str, list[TokenLogprobs]]]:
        ordered, logits = self._forward(rows)
        if any(r.num_drafts for r in ordered):
            logits, verified = self._verify(ordered, logits)
        else:
            verified = {}
        sampling = [r for r in ordered if r.sample and not r.num_drafts]
        if not sampling:
            return [verified.get(r.request_id, ()) for r in rows], {}
        if scheduler_output.token_masks is not None:
            _apply_token_masks(logits, sampling, scheduler_output.token_masks.wait())
        sampler_rows = [
            SamplingRow(r.request_id, r.state.sampling_params, r.state.num_output_tokens,
                        r.state.eos_token_id)
            for r in sampling
        ]  # fmt: skip
        token_ids, logprobs = self.sampler.sample(logits, sampler_rows)
        by_id: dict[str, list[int]] = verified
        for row, token in zip(sampling, token_ids, strict=True):
            row.state.token_ids.append(token)
            by_id[row.request_id] = [token]
        sampled: list[Sequence[int]] = [by_id.get(r.request_id, ()) for r in rows]
        return sampled, {sampling[i].request_id: [lp] for i, lp in logprobs.items()}

    def _verify(
        self, ordered: list[_Row], logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, list[int]]]:
        """Verify the draft rows (heddle.spec.rejection): greedy rows keep the drafts that are
        the target's argmax, sampled rows are rejection-sampled against the distribution the
        sampler would draw from. Returns the logits of the other sampling rows and, per draft
        row, its accepted drafts plus one token (appended to its known tokens here)."""
        keep: list[int] = []
        verified: dict[str, list[int]] = {}
        offset = 0
        for r in ordered:
            if not r.sample:
                continue
            n = r.num_drafts + 1 if r.num_drafts else 1
            if not r.num_drafts:
                keep.append(offset)
            else:
                tokens = verify(logits[offset : offset + n], r.token_ids[-r.num_drafts :],
                                r.state.sampling_params, r.draft_probs)
                r.state.token_ids.extend(tokens)
                verified[r.request_id] = tokens
            offset += n
        index = torch.tensor(keep, dtype=torch.int64, device=logits.device)
        return logits.index_select(0, index), verified

    def compute_logits(self, scheduler_output: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Run one step like `execute`, but return the float32 logits [vocab] of each sampling
        request instead of sampling (for tests and scoring)."""
        rows = self._rows(scheduler_output)
        with torch.inference_mode():
            ordered, logits = self._forward(rows)
        sampling = [r.request_id for r in ordered if r.sample]
        return {request_id: logits[i] for i, request_id in enumerate(sampling)}


@dataclass(slots=True)
class _RequestState:
    """What the executor keeps of a request between steps (dropped when it leaves)."""

    token_ids: list[int]  # every known token: prompt, outputs (the executor appends its samples)
    num_prompt_tokens: int
    block_table: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(slots=True)
class _Row:
    """One request's share of this step."""

    request_id: str
    token_ids: list[int]  # the tokens computed at positions start_position.. (with drafts)
    start_position: int
    sample: bool
    state: _RequestState
    num_drafts: int = 0  # the last num_drafts of token_ids are draft tokens to verify
    draft_probs: torch.Tensor | None = None  # [num_drafts, vocab]: a draft model's q (sampled)


def _apply_token_masks(
    logits: torch.Tensor, sampling: list[_Row], masks: Mapping[str, Sequence[int]]
) -> None:
    """Disallowed tokens get -inf logits. `masks`: request id -> bitmask as 32-bit words (an
    int32 tensor row, as the grammar matchers fill it, or any sequence of ints)."""
    indices = [i for i, row in enumerate(sampling) if row.request_id in masks]
    if not indices:
        return
    words = torch.stack([_mask_words(masks[sampling[i].request_id]) for i in indices])
    vocab = logits.shape[-1]
    width = (vocab + 31) // 32
    if words.shape[1] < width:  # a short mask allows nothing beyond its end
        words = torch.cat([words, words.new_zeros(words.shape[0], width - words.shape[1])], 1)
    apply_token_bitmask(logits, indices, words)


def _mask_words(words: Sequence[int]) -> torch.Tensor:
    if isinstance(words, torch.Tensor):
        return words.to(torch.int32)
    # Words may be given unsigned (up to 2**32 - 1): wrap them to int32's bit pattern.
    return (torch.tensor(list(words), dtype=torch.int64) & 0xFFFFFFFF).to(torch.int32)
