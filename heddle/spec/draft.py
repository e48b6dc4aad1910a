"""Draft-model proposals: a smaller model that shares the target's tokenizer guesses k tokens.

The draft model runs in its own `ModelExecutor` with its own paged KV cache. Per request it
keeps the tokens it has K/V for; each proposal round first rolls that back to the longest
prefix the request's known tokens still share (rejected drafts are forgotten), computes the
known tokens it has not seen in one chunk, then decodes k tokens one step at a time, batched
across requests. Greedy requests get the draft's argmax (point masses); sampled requests get
draws from the draft's distribution under the request's own sampling parameters, with those
distributions (q) for rejection sampling. A request the draft cache cannot hold gets no
proposal (it decodes normally) rather than an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from heddle.config import CacheConfig, ModelConfig, SpeculativeConfig
from heddle.core.outputs import NewRequest, OutputBuilder
from heddle.errors import HeddleError
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams
from heddle.spec.rejection import sampling_probs


@dataclass(slots=True)
class DraftProposal:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # [len(token_ids), vocab] for sampled requests


@dataclass(slots=True)
class ProposalRequest:
    request_id: str
    token_ids: Sequence[int]  # the request's known tokens (prompt + output)
    k: int
    params: SamplingParams
    num_prompt_tokens: int = 0


@dataclass(slots=True)
class _DraftState:
    computed: list[int] = field(default_factory=list)  # tokens with K/V in the draft cache
    blocks: list[int] = field(default_factory=list)


class DraftModelProposer:
    def __init__(self, executor: ModelExecutor, target_vocab_size: int | None = None,
                 seed: int = 0) -> None:
        vocab = executor.model_shape.vocab_size
        if target_vocab_size is not None and vocab != target_vocab_size:
            raise HeddleError(
                f"the draft model's vocabulary ({vocab} tokens) differs from the target's "
                f"({target_vocab_size}): they must share a tokenizer"
            )
        self.executor = executor
        self.block_size = executor.block_size
        self._free = list(range(executor.num_blocks - 1, -1, -1))
        self._states: dict[str, _DraftState] = {}
        self._step_id = 0
        self._forgotten: list[str] = []  # ids the draft executor may drop at its next step
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def request_ids(self) -> list[str]:
        """The requests whose draft K/V is kept (until `forget`)."""
        return list(self._states)

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            state = self._states.pop(request_id, None)
            if state is not None:
                self._free.extend(state.blocks)
                self._forgotten.append(request_id)

    def rename(self, old_id: str, new_id: str) -> bool:
        """Hand `old_id`'s draft K/V to `new_id` (an agent session's next turn takes its
        paused context's: heddle/sessions/draft_kv.py). False when `old_id` has none."""
        state = self._states.pop(old_id, None)
        if state is None:
            return False
        self.forget([new_id])
        self._states[new_id] = state
        self._forgotten.append(old_id)  # the draft executor's own row state under the old id
        return True

    def blocks_held(self, request_id: str) -> int:
        state = self._states.get(request_id)
        return 0 if state is None else len(state.blocks)

    def blocks_wanted(self, requests: Sequence[ProposalRequest]) -> int:
        """Free blocks a `propose` of `requests` would take (the ones it reserves)."""
        wanted = 0
        for request in requests:
            if request.k <= 0 or not request.token_ids:
                continue
            held = self.blocks_held(request.request_id)
            wanted += max(0, -(-(len(request.token_ids) + request.k - 1) // self.block_size)
                          - held)
        return wanted

    def propose(self, requests: Sequence[ProposalRequest]) -> dict[str, DraftProposal]:
        """Up to `k` draft tokens per request, all requests batched in each draft step."""
        active: list[tuple[ProposalRequest, _DraftState, list[int]]] = []
        out: dict[str, DraftProposal] = {}
        for request in requests:
            if request.k <= 0 or not request.token_ids:
                continue
            state = self._states.setdefault(request.request_id, _DraftState())
            known = list(request.token_ids)
            common = _common_prefix(state.computed, known)
            common = min(common, len(known) - 1)  # the last known token gives the logits
            del state.computed[common:]
            if len(known) + request.k - 1 > self.executor.max_model_len or not self._reserve(
                state, len(known) + request.k - 1
            ):
                continue
            active.append((request, state, known[common:]))
            out[request.request_id] = DraftProposal([])
        probs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _, _ in active}
        with torch.inference_mode():
            for round_index in range(max((r.k for r, _, _ in active), default=0)):
                batch = [(r, s, chunk) for r, s, chunk in active if r.k > round_index]
                if not batch:
                    break
                logits = self._step(batch)
                for (request, state, chunk), row in zip(batch, logits, strict=True):
                    state.computed.extend(chunk)
                    token, q = self._pick(row, request.params)
                    out[request.request_id].token_ids.append(token)
                    if q is not None:
                        probs[request.request_id].append(q)
                    chunk[:] = [token]  # next round computes this draft token
        for request_id, rows in probs.items():
            if rows:
                out[request_id].probs = torch.stack(rows)
        return out

    def _step(self, batch: list[tuple[ProposalRequest, _DraftState, list[int]]]
              ) -> list[torch.Tensor]:
        """One forward pass of the draft model over the batch's chunks. Each row is sent as a
        new request (its tokens so far and its block table): the draft executor's own state
        per request is replaced every round, so rollbacks need no message of their own."""
        builder = OutputBuilder(self._step_id)
        for request, state, chunk in batch:
            known = state.computed + chunk
            new = NewRequest(request.request_id, known, min(request.num_prompt_tokens, len(known)),
                             list(state.blocks), request.params)
            builder.add(request.request_id, len(state.computed), len(chunk), True,
                        num_prompt_tokens=new.num_prompt_tokens, new_request=new)
        output = builder.build(finished_request_ids=self._forgotten)
        self._forgotten = []
        logits = self.executor.compute_logits(output)
        self._step_id += 1
        return [logits[request.request_id] for request, _, _ in batch]

    def _pick(self, logits: torch.Tensor, params: SamplingParams
              ) -> tuple[int, torch.Tensor | None]:
        if params.temperature == 0.0:
            return int(logits.argmax()), None
        q = sampling_probs(logits.float().unsqueeze(0), params)[0]
        return int(torch.multinomial(q, 1, generator=self._generator)), q

    def _reserve(self, state: _DraftState, num_tokens: int) -> bool:
        needed = -(-num_tokens // self.block_size) - len(state.blocks)
        if needed > len(self._free):
            return False
        for _ in range(needed):
            state.blocks.append(self._free.pop())
        return True


def attach_draft_model(executor: ModelExecutor, speculation: SpeculativeConfig,
                       model_config: ModelConfig | None = None) -> DraftModelProposer | None:
    """With `speculation.method == "draft"`, load the draft model beside `executor`'s (same
    dtype, device and quantization choice as `model_config`, the target's) with as many KV
    blocks as the target's pool (a smaller model: a smaller cache, and room for every request
    the target holds), and hand the executor the proposer. Returns it (None: no draft)."""
    if speculation.method != "draft":
        return None
    assert speculation.model is not None  # SpeculativeConfig checks it
    target = model_config or ModelConfig()
    draft_config = ModelConfig(model=speculation.model, dtype=target.dtype, device=target.device,
                               max_model_len=executor.max_model_len,
                               quantization=target.quantization)
    draft_executor = ModelExecutor(
        draft_config, CacheConfig(block_size=executor.block_size, num_blocks=executor.num_blocks)
    )
    proposer = DraftModelProposer(draft_executor, executor.model_shape.vocab_size)
    executor.draft = proposer
    return proposer


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
