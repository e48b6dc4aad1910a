"""Greedy speculation in batches: with batch-invariant linears every row computes what it would
alone, so a request's logits do not depend on its batch (decode rows, verify rows, other
requests), and greedy outputs with speculation are those without it at any batch."""

from __future__ import annotations

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig, SpeculativeConfig
from heddle.engine.engine import Engine
from heddle.engine.llm import build_config
from heddle.errors import HeddleError
from heddle.model.batch_invariant import ROW_TILE, RowTiledLinear
from heddle.model.executor import ModelExecutor, _RequestState, _Row
from heddle.model.layers import Linear
from heddle.request import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
PROMPTS = [
    [1, 504, 3458, 282, 1789, 28, 940, 2329, 30, 422, 7144, 253, 1790, 30, 504, 3458],
    [1, 2329, 30, 422, 7144, 253, 1790, 30, 504, 3458, 282, 1789, 28, 940],
    [1, 940, 2329, 30, 504, 3458, 282, 1789, 28, 422, 7144],
    [1, 7144, 253, 1790, 30, 504, 3458, 282, 1789, 28, 940, 2329, 30, 422, 7144, 253, 17, 9],
    [1, 1789, 28, 940, 2329, 30, 422, 7144, 253, 1790],
    [1, 3458, 282, 1789, 28, 940, 2329, 30, 422, 7144, 253, 1790, 30, 504, 3458, 282, 1789],
]


def test_row_tiled_linear_gives_each_row_its_result_alone():
    torch.manual_seed(0)
    weight = torch.randn(96, 64).to(torch.bfloat16)
    bias = torch.randn(96).to(torch.bfloat16)
    tiled = RowTiledLinear(Linear(weight, bias))
    x = torch.randn(2 * ROW_TILE + 7, 64).to(torch.bfloat16)
    alone = torch.cat([tiled(x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(tiled(x), alone)
    assert torch.allclose(tiled(x).float(), (x.float() @ weight.float().T + bias.float()),
                          atol=0.5, rtol=0.02)
    with pytest.raises(ValueError):
        RowTiledLinear(Linear(weight), tile=0)


@pytest.fixture(scope="module")
def invariant_executor() -> ModelExecutor:
    """The embedded model as it runs by default (quantization auto, bf16 on this CPU), with
    batch-invariant linears."""
    return ModelExecutor(ModelConfig(batch_invariant=True),
                         CacheConfig(block_size=16, num_blocks=64))


def _prefilled(executor: ModelExecutor) -> list[_RequestState]:
    """Each prompt prefilled alone (block tables of 4 blocks each), its last token unknown to
    the cache."""
    states = []
    for i, prompt in enumerate(PROMPTS):
        state = _RequestState(list(prompt), len(prompt), list(range(4 * i, 4 * i + 4)), GREEDY,
                              None)
        with torch.inference_mode():
            executor._forward([_Row(f"r{i}", prompt[:-1], 0, False, state)])
        states.append(state)
    return states


def _logits_of(executor: ModelExecutor, rows: list[_Row], request_id: str) -> torch.Tensor:
    with torch.inference_mode():
        ordered, logits = executor._forward(rows)
    offset = 0
    for r in ordered:
        n = r.num_drafts + 1
        if r.request_id == request_id:
            return logits[offset : offset + n]
        offset += n
    raise AssertionError(f"{request_id} was not laid out")


def test_a_rows_logits_do_not_depend_on_its_batch(invariant_executor):
    """Request 0's logits at its next position (and at the four after it, fed its own greedy
    tokens): alone, in a decode step with five other requests, and as a verify row among
    other verify rows (40 rows: more than one tile) are bit for bit the same."""
    executor = invariant_executor
    states = _prefilled(executor)
    start = [len(p) - 1 for p in PROMPTS]

    def decode(i: int) -> _Row:
        return _Row(f"r{i}", [PROMPTS[i][-1]], start[i], True, states[i])

    alone = _logits_of(executor, [decode(0)], "r0")
    batched = _logits_of(executor, [decode(i) for i in range(6)], "r0")
    assert torch.equal(alone, batched)
    # Its own greedy continuation, one decode step at a time (alone).
    tokens = [PROMPTS[0][-1]]
    sequential = [alone[0]]
    for j in range(4):
        tokens.append(int(sequential[-1].argmax()))
        row = _Row("r0", [tokens[-1]], start[0] + j + 1, True, states[0])
        sequential.append(_logits_of(executor, [row], "r0")[0])
    # As a verify row of 4 drafts beside five verify rows of 4 drafts each and 10 decodes of
    # the others again: 6 * 5 + ... rows; every row of request 0 matches its decode alone.
    verify_rows = [_Row("r0", list(tokens), start[0], True, states[0], 4)]
    for i in range(1, 6):
        drafts = [PROMPTS[i][k] for k in range(4)]
        verify_rows.append(_Row(f"r{i}", [PROMPTS[i][-1], *drafts], start[i], True, states[i],
                                4))
    verified = _logits_of(executor, verify_rows, "r0")
    assert torch.equal(verified, torch.stack(sequential))


def _generate(executor: ModelExecutor, speculation: SpeculativeConfig, seats: int,
              prompts: list[list[int]], max_tokens: int,
              budget: int | None = None) -> tuple[list[list[int]], Engine]:
    """Greedy outputs of `prompts` through the engine (`seats` at once, `budget` tokens a
    step), in prompt order; no KV may be left behind."""
    config = build_config(max_num_seqs=seats, block_size=16, num_blocks=executor.num_blocks,
                          max_num_batched_tokens=budget, speculation=speculation)
    engine = Engine(config, executor, num_blocks=executor.num_blocks,
                    tokenizer=executor.tokenizer, eos_token_id=executor.eos_token_id,
                    max_model_len=executor.max_model_len,
                    vocab_size=executor.model_shape.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs: dict[str, list[int]] = {}
    for _ in range(50 * len(prompts) * max_tokens):  # bounded: a stuck engine fails the test
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    assert sorted(outputs) == sorted(str(i) for i in range(len(prompts)))
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks  # no KV left behind
    return [outputs[str(i)] for i in range(len(prompts))], engine


def _last_logits(executor: ModelExecutor, prompt: list[int], chunks: list[int], table: list[int],
                 start: int = 0) -> torch.Tensor:
    """The logits of `prompt`'s last token, its tokens from `start` on computed in steps of
    `chunks` tokens (the K/V of tokens before `start` already in the table's blocks)."""
    state = _RequestState(list(prompt), len(prompt), table, GREEDY, None)
    logits = None
    with torch.inference_mode():
        for n in chunks:
            _, logits = executor._forward([_Row("p", prompt[start:start + n], start,
                                                start + n == len(prompt), state)])
            start += n
    assert logits is not None and start == len(prompt)
    return logits[-1]


def test_a_prompts_logits_do_not_depend_on_its_chunking_or_the_prefix_cache(invariant_executor):
    """A 45-token prompt's last logits: prefilled at once, in chunks of 16 + 16 + 13, in
    chunks of 7 beside another request's decode, and with its first 32 tokens' K/V taken from
    another prefill's blocks (a prefix-cache hit) are bit for bit the same, and equal the
    logits of decoding its last token. (Attention over a prefill chunk -- SDPA over the chunk,
    or over a gathered cached prefix -- gave other bits: 0.6 apart in the logits.)"""
    executor = invariant_executor
    prompt = PROMPTS[0] + PROMPTS[1] + PROMPTS[4] + [7144, 253, 1790, 30, 504]
    assert len(prompt) == 45
    whole = _last_logits(executor, prompt, [45], [40, 41, 42])
    assert torch.equal(_last_logits(executor, prompt, [16, 16, 13], [43, 44, 45]), whole)
    # Blocks 40 and 41 hold tokens 0..31 of the whole prefill: the cache hit.
    assert torch.equal(_last_logits(executor, prompt, [13], [40, 41, 46], start=32), whole)
    assert torch.equal(_last_logits(executor, prompt, [44, 1], [47, 48, 49]), whole)
    other = _prefilled(executor)[2]
    state = _RequestState(list(prompt), len(prompt), [50, 51, 52], GREEDY, None)
    start = 0
    with torch.inference_mode():
        while start < len(prompt):
            n = min(7, len(prompt) - start)
            decode = _Row("r2", [PROMPTS[2][-1]], len(PROMPTS[2]) - 1, True, other)
            ordered, logits = executor._forward(
                [decode, _Row("p", prompt[start:start + n], start, start + n == 45, state)])
            start += n
    # One logits row per sampling row, in the order the rows were laid out.
    assert torch.equal(logits[[r.request_id for r in ordered if r.sample].index("p")], whole)


@pytest.mark.slow
def test_greedy_speculation_is_exact_across_batches_chunking_and_the_prefix_cache(
        invariant_executor):
    """Six prompts of 26-30 tokens that share their first 16 (a block) and repeat a span of
    their own (so prompt lookup drafts), a 16-token step budget (every prompt prefilled in two
    chunks, beside other requests' decodes and verify rows), greedy, 10 tokens: prompt lookup
    with fixed and adaptive K gives, at 3 seats (requests join while others decode) and at 6,
    the outputs of the run without it at 6 seats, and those are each request's outputs alone;
    later prompts are served from the prefix cache; no KV is left behind (`_generate`)."""
    executor = invariant_executor
    shared = PROMPTS[3][:16]
    spans = [p[1:7] for p in PROMPTS[:4]] + [PROMPTS[4][1:6], PROMPTS[2][1:8]]
    prompts = [shared + span + span for span in spans]
    assert all(16 < len(p) <= 30 for p in prompts)  # no prompt fits one step: all chunked
    alone, _ = _generate(executor, SpeculativeConfig(method="off"), 1, prompts, 10, budget=16)
    off, engine = _generate(executor, SpeculativeConfig(method="off"), 6, prompts, 10,
                            budget=16)
    assert engine.kv_cache.prefix_hits >= 16  # some prompt found the shared block
    assert off == alone
    for seats in (3, 6):
        for adaptive in (False, True):
            spec_out, engine = _generate(
                executor, SpeculativeConfig(method="ngram", num_draft_tokens=4,
                                            adaptive=adaptive), seats, prompts, 10, budget=16)
            speculator = engine.scheduler.speculator
            assert speculator is not None
            if not adaptive:  # fixed K drafted: the verify path was taken
                assert speculator.acceptance.num_drafted >= 8, seats
            assert spec_out == off, (seats, adaptive)


def test_batch_invariant_needs_the_decode_kernel():
    with pytest.raises(HeddleError, match="decode attention"):
        ModelExecutor(ModelConfig(batch_invariant=True), CacheConfig(block_size=16, num_blocks=8),
                      use_decode_kernel=False)
