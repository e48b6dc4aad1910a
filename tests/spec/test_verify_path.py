"""The executor's verify rows: a request's known token and k drafts run as k + 1 decode rows
(the decode attention, each query over its context up to itself) with the kernels the step
would run without its drafts. Their logits are those of k + 1 one-token decode steps."""

from __future__ import annotations

import pytest
import torch

from heddle.config import CacheConfig, ModelConfig
from heddle.model.executor import ModelExecutor, _RequestState, _Row
from heddle.model.linear_plan import apply_plan, dispatch_groups
from heddle.request import SamplingParams

PROMPT = [1, 504, 3458, 282, 1789, 28, 940, 2329, 30, 422, 7144, 253, 1790, 30, 504, 3458]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def _prefill(executor: ModelExecutor, table: list[int]) -> _RequestState:
    state = _RequestState(list(PROMPT), len(PROMPT), table, GREEDY, None)
    with torch.inference_mode():
        executor._forward([_Row("r", PROMPT[:-1], 0, False, state)])
    return state


def _sequential(executor: ModelExecutor, state: _RequestState, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] of one-token decode steps feeding `tokens` in turn."""
    rows = []
    with torch.inference_mode():
        for j, token in enumerate(tokens):
            _, logits = executor._forward([_Row("r", [token], len(PROMPT) - 1 + j, True, state)])
            rows.append(logits[0])
    return torch.stack(rows)


def _verify_logits(executor: ModelExecutor, state: _RequestState, tokens: list[int],
                   other: _Row | None = None) -> torch.Tensor:
    row = _Row("r", list(tokens), len(PROMPT) - 1, True, state, len(tokens) - 1)
    with torch.inference_mode():
        ordered, logits = executor._forward([row] if other is None else [other, row])
    offset = 0
    for r in ordered:  # the step's sampled rows in layout order: this row's k + 1
        n = r.num_drafts + 1
        if r is row:
            return logits[offset : offset + n]
        offset += n
    raise AssertionError("the verify row was not laid out")


def test_verify_rows_on_the_decode_path_match_one_token_decodes(smol_executor):
    executor = smol_executor
    state = _prefill(executor, [40, 7])
    tokens = [PROMPT[-1], 940, 2329, 30, 422]  # the known token and four drafts
    sequential = _sequential(executor, state, tokens)
    assert executor.verify_on_decode_path
    on_decode = _verify_logits(executor, state, tokens)
    executor.verify_on_decode_path = False
    try:
        as_chunk = _verify_logits(executor, state, tokens)
    finally:
        executor.verify_on_decode_path = True
    # Another request decoding in the same step (its own table) changes nothing.
    other_state = _RequestState(list(PROMPT[:6]), 6, [3], GREEDY, None)
    with torch.inference_mode():
        executor._forward([_Row("o", PROMPT[:5], 0, False, other_state)])
    batched = _verify_logits(executor, state, tokens, _Row("o", [PROMPT[5]], 5, True, other_state))
    for logits in (on_decode, as_chunk, batched):
        assert torch.equal(logits.argmax(-1), sequential.argmax(-1))
        assert torch.allclose(logits, sequential, atol=2e-3, rtol=0)
    # Causal: a query does not see the drafts after it (the first row is the plain decode's).
    changed = _verify_logits(executor, state, [PROMPT[-1], 940, 2329, 30, 9999])
    assert torch.allclose(changed[:4], on_decode[:4], atol=1e-4, rtol=0)
    assert not torch.allclose(changed[4], on_decode[4], atol=1e-2, rtol=0)


@pytest.fixture(scope="module")
def auto_executor() -> ModelExecutor:
    """The embedded model under quantization auto, with a plan that runs the quantized kernels
    at 1 row only (whatever this machine's timings): a 1-row decode runs int4 (int8 head), a
    verify row of 5 would run the float path."""
    executor = ModelExecutor(ModelConfig(quantization="auto"),
                             CacheConfig(block_size=16, num_blocks=24))
    layers = executor.model.linears.built
    groups = dispatch_groups(layers)
    if not groups:
        pytest.skip(f"auto has nothing to dispatch on this machine ({executor.quantization})")
    apply_plan(layers, dict.fromkeys(groups, 1))
    return executor


@pytest.mark.slow
def test_verify_rows_run_the_kernels_of_the_step_without_drafts(auto_executor):
    """With `verify_kernels_as_decode` a verify row runs the 1-row kernels, and its greedy
    tokens are the one-token decodes' exactly."""
    executor = auto_executor
    layers = executor.model.linears.built
    plan = [layer.max_rows for layer in layers]
    state = _prefill(executor, [4, 2])
    # The drafts are the model's own greedy continuation: every one must be accepted.
    tokens = [PROMPT[-1]]
    for _ in range(4):
        tokens.append(int(_sequential(executor, state, tokens)[-1].argmax()))
    sequential = _sequential(executor, state, tokens)
    same_kernels = _verify_logits(executor, state, tokens)
    assert [layer.max_rows for layer in layers] == plan  # the override is undone
    executor.verify_kernels_as_decode = False
    try:
        row_kernels = _verify_logits(executor, state, tokens)
    finally:
        executor.verify_kernels_as_decode = True
    assert torch.equal(same_kernels.argmax(-1), sequential.argmax(-1))
    assert tokens[1:] == same_kernels.argmax(-1).tolist()[:4]
    # The 1-row kernels are what makes it close: the float path's rounding differs more.
    error_same = (same_kernels - sequential).abs().max().item()
    error_rows = (row_kernels - sequential).abs().max().item()
    assert error_same < error_rows, (error_same, error_rows)


@pytest.mark.slow
def test_greedy_speculation_is_exact_on_the_quantized_path_one_stream(auto_executor):
    """The engine at one stream on the auto-quantized model: prompt lookup (fixed K) gives the
    outputs of the run without speculation token for token, and leaves no KV behind."""
    from heddle import LLM
    from heddle.config import SpeculativeConfig
    from heddle.engine.engine import Engine
    from heddle.engine.llm import build_config

    executor = auto_executor
    prompts = ["Copy this text: the cat sat on the mat. the cat sat on the mat. the cat sat",
               "List the numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outputs = []
    for speculation in (SpeculativeConfig(method="off"),
                        SpeculativeConfig(method="ngram", num_draft_tokens=4, adaptive=False)):
        config = build_config(max_num_seqs=1, block_size=16, num_blocks=executor.num_blocks,
                              speculation=speculation)
        llm = LLM.from_engine(Engine(
            config, executor, num_blocks=executor.num_blocks, tokenizer=executor.tokenizer,
            eos_token_id=executor.eos_token_id, max_model_len=executor.max_model_len,
            vocab_size=executor.model_shape.vocab_size))
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        assert llm.engine.kv_cache.num_free_blocks == llm.engine.kv_cache.num_blocks
    spec = llm.engine.scheduler.speculator
    assert spec is not None and spec.acceptance.num_accepted > 0
    assert outputs[1] == outputs[0]
