"""The scheduler's side of speculative decoding: which decoding requests get draft tokens this
step, how many, and which tokens.

A speculative token is one more token a request is given in a step (no phases): a request
that decodes is granted 1 + k tokens, its last known token and k drafts, out of the same token
budget as every other request's prefill and decode tokens, and its KV slots are allocated for
all of them. The executor verifies the drafts in the same forward pass and returns the accepted
ones plus one token of its own; the scheduler then counts as computed only the accepted ones
(the rejected drafts' KV is overwritten as the request grows; see Scheduler.update).

Per step (`plan`): the candidates are the running requests with exactly one token to compute,
in the policy's order, that may speculate (not seeded, no logprobs, past min_tokens, tokens
left before max_tokens). Each is offered a proposal of up to `num_draft_tokens` drafts (prompt
lookup on its known tokens, or the simulator's stand-in), and `choose_draft_counts` keeps
those that pay: with `adaptive`, per request from its acceptance history and the step's cost
(the TPOT objective of an SLO request doubles its tokens' worth); without, all of them (fixed
K, the upstream behaviour). Drafts only use budget left after the running requests' known tokens and
the waiting requests' prompts: speculation never delays a prefill.

A request under a grammar (structured outputs) is no candidate: the executor verifies drafts
without the grammar's token mask, so its drafts could take tokens the grammar forbids.

Pure Python, no torch.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from heddle.spec.adaptive import (
    AcceptanceTracker,
    DraftCandidate,
    StepCostTable,
    choose_draft_counts,
    may_pay,
)
from heddle.spec.ngram import NgramProposer
from heddle.spec.sim import _mix64

if TYPE_CHECKING:
    from heddle.config import SpeculativeConfig
    from heddle.request import Request


class Proposer(Protocol):
    def propose(self, request_id: str, token_ids: Sequence[int], k: int) -> list[int]: ...

    def forget(self, request_ids: Iterable[str]) -> None: ...


class RepeatProposer:
    """k copies of the request's last token. The simulator's proposer: a simulated request
    emits one token id over and over, so these are the tokens it would accept; how many it
    does is the simulated executor's draw at the workload's acceptance rate. With a draft
    model (method=draft) they are the draft slots the scheduler grants: the executor's draft
    model proposes the tokens that fill them, in the same step (heddle/spec/draft.py)."""

    def __init__(self, proposal_rate: float = 1.0) -> None:
        # The simulator: a proposal in this share of a request's decode steps (prompt lookup
        # finds nothing in the rest), drawn from (request id, tokens known): reproducible.
        self._threshold = int(proposal_rate * (1 << 64))

    def propose(self, request_id: str, token_ids: Sequence[int], k: int) -> list[int]:
        if k <= 0 or not token_ids:
            return []
        if self._threshold < 1 << 64 and _mix64(
            zlib.crc32(request_id.encode()) << 24 ^ len(token_ids)
        ) >= self._threshold:
            return []
        return [token_ids[-1]] * k

    def forget(self, request_ids: Iterable[str]) -> None:
        pass


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer | None = None) -> None:
        self.config = config
        if proposer is None:
            if config.method == "ngram":
                proposer = NgramProposer(config.ngram_min, config.ngram_max)
            elif config.method == "sim":
                proposer = RepeatProposer(config.proposal_rate)
            elif config.method == "draft":
                proposer = RepeatProposer()
            else:
                raise ValueError(f"no proposer for speculation method {config.method!r}")
        self.proposer = proposer
        self.acceptance = AcceptanceTracker()
        self.costs = StepCostTable()
        self.num_steps_with_drafts = 0
        self.num_offers = 0  # decoding requests asked for a proposal
        self.num_proposals = 0  # ... that got one
        # Steps whose candidates were not looked up at all: no drafts could pay (adaptive).
        self.num_steps_skipped = 0

    def plan(
        self, candidates: Sequence[Request], base_tokens: int, token_budget: int
    ) -> dict[str, list[int]]:
        """Draft tokens per request id for this step (only the requests that get some).

        `candidates`: running requests with one token to compute, most urgent first;
        `base_tokens`: the tokens the step computes without drafts; `token_budget`: the most
        draft tokens it may add."""
        if token_budget <= 0:
            return {}
        k_max = self.config.num_draft_tokens
        adaptive = self.config.adaptive
        eligible: list[tuple[Request, int, float]] = []  # (request, most drafts, weight)
        for request in candidates:
            params = request.sampling_params
            if params.seed is not None or params.logprobs is not None:
                continue
            if request.grammar is not None:
                continue  # drafts are verified unmasked: a grammar's rows take none
            if request.num_output_tokens < params.min_tokens:
                continue  # the sampler holds EOS back there; verification does not
            room = min(k_max, request.max_num_tokens - len(request.all_token_ids) - 1)
            if room <= 0:
                continue
            eligible.append((request, room, 2.0 if request.tpot_slo is not None else 1.0))
        if not eligible:
            return {}
        rates = self.acceptance.rate
        if adaptive:
            # Before any lookup: could any drafts pay in this step, at their best? (None when
            # the step's size was never seen, or its cost table says verified tokens cost
            # more than they save: a big batch.) Then the step is exactly the step without
            # speculation, at the cost of this check alone.
            # First a bound from the best rate alone, then the greedy itself on every
            # eligible request as if each had a full proposal (a proposal is only ever
            # shorter: more drafts on offer never lower the best prefix's value).
            offered = [
                DraftCandidate(r.request_id, rates(r.request_id), room, weight)
                for r, room, weight in eligible
            ]
            best = max(c.rate * c.weight for c in offered)
            most = min(token_budget, sum(c.max_drafts for c in offered))
            if not may_pay(base_tokens, float(base_tokens), best, most, self.costs) or not (
                choose_draft_counts(
                    offered, base_tokens, float(base_tokens), self.costs, token_budget
                )
            ):
                self.num_steps_skipped += 1
                return {}
        proposals: dict[str, list[int]] = {}
        offers: list[DraftCandidate] = []
        for request, room, weight in eligible:
            drafts = self.proposer.propose(request.request_id, request.all_token_ids, room)
            self.num_offers += 1
            if not drafts:
                continue
            self.num_proposals += 1
            proposals[request.request_id] = drafts
            offers.append(
                DraftCandidate(request.request_id, rates(request.request_id), len(drafts), weight)
            )
        if not offers:
            return {}
        if adaptive:
            counts = choose_draft_counts(
                offers, base_tokens, float(base_tokens), self.costs, token_budget
            )
        else:
            counts = {c.request_id: c.max_drafts for c in offers}
        out: dict[str, list[int]] = {}
        for offer in offers:
            k = min(counts.get(offer.request_id, 0), token_budget)
            if k > 0:
                out[offer.request_id] = proposals[offer.request_id][:k]
                token_budget -= k
        if out:
            self.num_steps_with_drafts += 1
        return out

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        self.acceptance.observe(request_id, num_drafts, num_accepted)

    def observe_step(self, num_tokens: int, duration: float) -> None:
        self.costs.observe(num_tokens, duration)

    def forget(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        self.proposer.forget(ids)
        self.acceptance.forget(ids)
