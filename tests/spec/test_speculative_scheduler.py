"""Speculative tokens in the scheduler's token budget: drafts granted, verified, rolled back."""

from __future__ import annotations

import pytest

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from heddle.core.kv_cache import KVCacheManager
from heddle.core.outputs import ExecutorOutput
from heddle.core.scheduler import Scheduler
from heddle.engine.engine import Engine
from heddle.request import FinishReason, Request, SamplingParams
from heddle.sim import ConstantCostModel, SimulatedExecutor
from heddle.spec.sim import SimAcceptance

NGRAM = SpeculativeConfig(method="ngram", num_draft_tokens=4, adaptive=False)


def scheduler(spec: SpeculativeConfig = NGRAM, budget: int = 64, blocks: int = 32) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, speculation=spec)
    return Scheduler(config, KVCacheManager(blocks, 4, True), VirtualClock())


def request(request_id: str, prompt: list[int], max_tokens: int = 32, **params) -> Request:
    fields = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, **params}
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(**fields),
        arrival_time=0.0,
        eos_token_id=2,
    )


def step(s: Scheduler, answer):
    """One step; `answer(request_id, drafts)` gives the tokens each sampling row returns."""
    so = s.schedule()
    sampled = []
    for rid, sample in zip(so.request_ids, so.sample, strict=True):
        sampled.append(answer(rid, so.draft_token_ids.get(rid, [])) if sample else [])
    s.update(so, ExecutorOutput(sampled, 0.01))
    s.check_integrity()
    return so


def test_drafts_ride_in_the_budget_and_rejected_ones_are_rolled_back():
    s = scheduler()
    r = request("a", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    s.add_request(r)
    so = step(s, lambda rid, d: [7])  # the prefill samples 7: ... 5 6 7
    assert so.draft_token_ids == {}
    # Prompt lookup: "6 7" was followed by "8 5 6 7"; four drafts after the known token.
    so = step(s, lambda rid, d: [*d[:2], 9])  # two accepted, the third replaced by 9
    assert so.draft_token_ids == {"a": [8, 5, 6, 7]}
    assert so.num_new_tokens == [5] and so.sample == [True] and so.num_scheduled_tokens == 5
    assert r.output_token_ids == [7, 8, 5, 9]
    # The known token and the two accepted drafts are computed; 9 is known, not computed.
    assert r.num_computed_tokens == len(r.all_token_ids) - 1 == 13
    assert r.num_slots >= 15  # the slots of the rejected drafts stay with the request
    # Nothing to look up after "5 9": a plain decode row.
    so = step(s, lambda rid, d: [11])
    assert so.draft_token_ids == {} and so.num_new_tokens == [1]


def test_a_stop_inside_an_accepted_run_ends_the_request_there():
    s = scheduler()
    r = request("a", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], max_tokens=3)
    s.add_request(r)
    step(s, lambda rid, d: [7])
    so = step(s, lambda rid, d: [*d, 1])
    # max_tokens=3: at most two more tokens, so at most one draft was offered.
    assert so.draft_token_ids == {"a": [8]}
    assert r.output_token_ids == [7, 8, 1] and r.finish_reason is FinishReason.LENGTH
    assert s.kv_cache.num_free_blocks == s.kv_cache.num_blocks


def test_seeded_and_logprob_requests_do_not_speculate():
    s = scheduler()
    s.add_request(request("seeded", [5, 6, 5, 6, 5, 6], seed=1, temperature=0.5))
    s.add_request(request("logprobs", [5, 6, 5, 6, 5, 6], logprobs=1))
    step(s, lambda rid, d: [5])
    so = step(s, lambda rid, d: [6])
    assert so.draft_token_ids == {} and so.num_new_tokens == [1, 1]


def test_drafts_never_take_budget_a_waiting_prompt_needs():
    s = scheduler(budget=12)
    s.add_request(request("a", [5, 6, 7, 5, 6, 7, 5, 6]))
    step(s, lambda rid, d: [7])
    s.add_request(request("b", list(range(100, 111))))  # an 11-token prompt waits
    so = step(s, lambda rid, d: [*d, 5] if d else [5])
    # 1 decode token + 11 prompt tokens fill the budget: no drafts this step.
    assert so.draft_token_ids == {} and so.num_scheduled_tokens == 12


@pytest.mark.parametrize("adaptive", [False, True])
def test_simulated_speculation_keeps_lengths_and_frees_every_block(adaptive):
    clock = VirtualClock()
    spec = SpeculativeConfig(method="sim", num_draft_tokens=3, adaptive=adaptive)
    config = EngineConfig(
        cache=CacheConfig(block_size=4, num_blocks=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, speculation=spec),
    )
    executor = SimulatedExecutor(ConstantCostModel(0.01), clock, vocab_size=500,
                                 acceptance=SimAcceptance(0.7, 0.2))
    engine = Engine(config, executor, num_blocks=256, clock=clock, eos_token_id=1,
                    vocab_size=500)
    lengths = {f"r{i}": 5 + 7 * i for i in range(12)}
    for rid, n in lengths.items():
        engine.add_request(rid, list(range(10, 30)), SamplingParams(max_tokens=200),
                           true_output_len=n)
    done = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = len(out.outputs[0].token_ids)
        engine.scheduler.check_integrity()
        steps += 1
    assert done == lengths
    speculator = engine.scheduler.speculator
    assert speculator is not None and speculator.acceptance.num_accepted > 0
    assert steps < sum(lengths.values()) // 8 + 40  # several tokens per request-step
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_simulated_proposals_come_at_the_proposal_rate():
    """method=sim with proposal_rate: prompt lookup finds a match in only some decode steps;
    the simulator's proposer offers drafts in that share of them, the same way every run."""
    from heddle.spec.speculator import RepeatProposer, Speculator

    proposer = RepeatProposer(0.3)
    offered = [bool(proposer.propose(f"r{i}", list(range(n)), 2))
               for i in range(50) for n in range(1, 41)]
    assert 0.25 < sum(offered) / len(offered) < 0.35
    assert offered == [bool(RepeatProposer(0.3).propose(f"r{i}", list(range(n)), 2))
                       for i in range(50) for n in range(1, 41)]
    assert all(RepeatProposer().propose("x", [1, 2, 3], 2) == [3, 3] for _ in range(3))
    speculator = Speculator(SpeculativeConfig(method="sim", proposal_rate=0.0, adaptive=False))
    assert speculator.plan([request("a", [1, 2, 3])], 1, 64) == {}
    assert (speculator.num_offers, speculator.num_proposals) == (1, 0)


class CountingProposer:
    """Prompt lookup's stand-in: two drafts for everyone, calls counted."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, request_id, token_ids, k):
        self.calls += 1
        return [token_ids[-1]] * min(k, 2)

    def forget(self, request_ids):
        pass


def test_adaptive_looks_nothing_up_where_no_draft_can_pay():
    """Adaptive K decides from the cost table whether any draft could pay at this step's size
    before any proposal is looked up: a step that cannot speculate costs no lookups."""
    from heddle.spec.speculator import Speculator

    proposer = CountingProposer()
    spec = Speculator(SpeculativeConfig(method="ngram", num_draft_tokens=4), proposer)
    requests = [request(f"r{i}", [1, 2, 3, 4]) for i in range(8)]
    # No step of 8 tokens seen yet: it runs without drafts, and nothing is looked up.
    assert spec.plan(requests, 8, 100) == {}
    assert proposer.calls == 0 and spec.num_steps_skipped == 1
    # Compute-bound: every token costs its share of the step; no draft at 0.5 pays.
    for tokens in (1, 8, 16, 64):
        spec.observe_step(tokens, 0.01 * tokens)
    assert spec.plan(requests, 8, 100) == {}
    assert proposer.calls == 0 and spec.num_steps_skipped == 2
    # Memory-bound: the same steps all cost the same. Every request is offered drafts.
    flat = Speculator(SpeculativeConfig(method="ngram", num_draft_tokens=4), proposer)
    for tokens in (1, 8, 16, 64):
        flat.observe_step(tokens, 0.01)
    drafts = flat.plan(requests, 8, 100)
    assert proposer.calls == 8 and len(drafts) == 8 and flat.num_steps_skipped == 0
    # Fixed K always looks up.
    fixed = Speculator(SpeculativeConfig(method="ngram", num_draft_tokens=4, adaptive=False),
                       proposer)
    assert len(fixed.plan(requests, 8, 100)) == 8 and proposer.calls == 16
