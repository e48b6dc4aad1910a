"""The draft-model proposer on a tiny random Qwen3 (transformers writes it to a temp dir): its
greedy proposals are the draft model's own greedy continuation (checked against transformers),
across rounds whose known tokens diverge from earlier proposals (KV rolled back), batched over
requests of different lengths; sampled proposals carry their distributions."""

from __future__ import annotations

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.errors import HeddleError
from heddle.model.executor import ModelExecutor
from heddle.request import SamplingParams
from heddle.spec.draft import DraftModelProposer, ProposalRequest
from tests.model.reference import hf_greedy
from tests.model.test_tiny_models import VOCAB, qwen3

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    torch.manual_seed(7)
    model = qwen3().eval()
    path = tmp_path_factory.mktemp("draft")
    model.save_pretrained(path)
    executor = ModelExecutor(ModelConfig(model=str(path), dtype="float32"),
                             CacheConfig(block_size=4, num_blocks=64))
    return model, executor


def test_greedy_proposals_follow_the_draft_model_across_rollbacks(draft):
    model, executor = draft
    proposer = DraftModelProposer(executor, target_vocab_size=VOCAB)
    a = [5, 17, 300, 42, 8, 99, 250]
    b = [11, 12, 13]
    out = proposer.propose([ProposalRequest("a", a, 4, GREEDY), ProposalRequest("b", b, 2, GREEDY)])
    assert out["a"].token_ids == hf_greedy(model, a, 4)
    assert out["b"].token_ids == hf_greedy(model, b, 2)
    assert out["a"].probs is None
    # Two drafts accepted, the third replaced by another token: the draft's K/V of the
    # rejected ones is rolled back and the next round continues from the new known tokens.
    wrong = (out["a"].token_ids[2] + 1) % VOCAB
    a2 = a + out["a"].token_ids[:2] + [wrong]
    b2 = b + out["b"].token_ids + [hf_greedy(model, b + out["b"].token_ids, 1)[0]]
    out2 = proposer.propose([ProposalRequest("a", a2, 3, GREEDY),
                             ProposalRequest("b", b2, 3, GREEDY)])
    assert out2["a"].token_ids == hf_greedy(model, a2, 3)
    assert out2["b"].token_ids == hf_greedy(model, b2, 3)
    proposer.forget(["a", "b"])
    assert proposer.num_free_blocks == executor.num_blocks


def test_sampled_proposals_carry_their_distribution(draft):
    _, executor = draft
    proposer = DraftModelProposer(executor, seed=3)
    out = proposer.propose([ProposalRequest("s", [1, 2, 3, 4], 3, SamplingParams(temperature=0.9,
                                                                                  top_k=20))])
    proposal = out["s"]
    assert len(proposal.token_ids) == 3 and proposal.probs is not None
    assert proposal.probs.shape == (3, VOCAB)
    torch.testing.assert_close(proposal.probs.sum(dim=-1), torch.ones(3))
    for i, token in enumerate(proposal.token_ids):
        assert proposal.probs[i, token] > 0
        assert int((proposal.probs[i] > 0).sum()) <= 20
    proposer.forget(["s"])


def test_no_room_means_no_proposal(draft):
    _, executor = draft
    proposer = DraftModelProposer(executor)
    too_long = list(range(1, executor.num_blocks * executor.block_size))
    assert proposer.propose([ProposalRequest("x", too_long, 4, GREEDY)]) == {}
    with pytest.raises(HeddleError, match="share a tokenizer"):
        DraftModelProposer(executor, target_vocab_size=VOCAB + 1)
