"""Thinking budgets and the reasoning split end to end, on a tiny random Qwen3 that transformers
wrote to a temporary directory with a tokenizer and a thinking chat template.

The random model never closes its thinking block by itself within a few tokens, so a budget
always cuts: the engine appends `</think>` after exactly `budget` thinking tokens, the
continuation is what transformers generates from prompt + thinking + `</think>` (the forced
token's KV is computed like any known token), the phase the scheduler sees turns at the cut,
and the server shows exactly those thinking tokens as `message.reasoning`, streamed or not.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch

from heddle.config import CacheConfig, EngineConfig, ModelConfig
from heddle.engine.engine import Engine
from heddle.reasoning import Phase
from heddle.request import SamplingParams
from tests.model.reference import hf_greedy
from tests.reasoning.tiny_thinking import write_tiny_thinking_model
from tests.server.live import LiveServer

MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture(scope="module", params=["deepseek_r1", "qwen3"])
def model_dir(request, tmp_path_factory) -> tuple[str, Path]:
    path = tmp_path_factory.mktemp(request.param)
    return request.param, write_tiny_thinking_model(path, request.param)


def make_engine(path: Path) -> Engine:
    config = EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32"),
        cache=CacheConfig(block_size=4, num_blocks=256),
    )
    return Engine.from_config(config)


def run(engine: Engine, request_id: str, prompt: list[int], params: SamplingParams):
    """Step to completion; the phase the scheduler saw after each step."""
    engine.add_request(request_id, prompt, params)
    phases, final = [], None
    while engine.has_unfinished_requests():
        for output in engine.step():
            final = output
        request = engine.scheduler.requests.get(request_id)
        if request is not None and request.reasoning is not None:
            phases.append((request.num_output_tokens, request.reasoning.phase))
    return final, phases


def chat_prompt(engine: Engine, **template_kwargs) -> list[int]:
    text = engine.tokenizer.apply_chat_template(MESSAGES, **template_kwargs)
    return engine.tokenizer.encode(text)


def test_budget_cuts_the_prompt_opened_block(model_dir):
    family, path = model_dir
    if family != "deepseek_r1":
        pytest.skip("the qwen3 template leaves opening the block to the model")
    engine = make_engine(path)
    fmt = engine.reasoning_format
    assert fmt is not None
    prompt = chat_prompt(engine)
    assert fmt.starts_in_thinking(prompt)
    budget, total = 5, 16
    params = SamplingParams(temperature=0.0, max_tokens=total, ignore_eos=True)
    free, _ = run(engine, "free", prompt, params)
    cut, phases = run(engine, "cut", prompt, SamplingParams(
        temperature=0.0, max_tokens=total, ignore_eos=True, max_thinking_tokens=budget))
    free_ids, cut_ids = free.outputs[0].token_ids, cut.outputs[0].token_ids
    assert fmt.end_token_id not in free_ids[:budget]  # the model did not close it itself
    assert cut_ids[:budget] == free_ids[:budget]
    assert cut_ids[budget] == fmt.end_token_id
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(
        path, torch_dtype=torch.float32).eval()
    forced_prefix = prompt + cut_ids[: budget + 1]
    assert cut_ids[budget + 1 :] == hf_greedy(model, forced_prefix, total - budget - 1)
    # The scheduler saw thinking until the cut, answering after it.
    assert all(p is Phase.THINKING for n, p in phases if n < budget)
    assert all(p is Phase.ANSWERING for n, p in phases if n > budget)
    engine.check_integrity()


def test_budget_zero_closes_the_block_in_the_prompt(model_dir):
    family, path = model_dir
    engine = make_engine(path)
    prompt = chat_prompt(engine)
    out, phases = run(engine, "zero", prompt, SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, max_thinking_tokens=0))
    fmt = engine.reasoning_format
    assert fmt is not None
    if family == "deepseek_r1":
        assert out.prompt_token_ids == [*prompt, fmt.end_token_id]
    assert all(p is Phase.ANSWERING for _, p in phases)


def test_enable_thinking_false_starts_in_the_answer(model_dir):
    family, path = model_dir
    if family != "qwen3":
        pytest.skip("only Qwen3's template reads enable_thinking")
    engine = make_engine(path)
    prompt = chat_prompt(engine, enable_thinking=False)
    assert engine.reasoning_format is not None
    assert not engine.reasoning_format.starts_in_thinking(prompt)


@pytest.fixture(scope="module")
def server(model_dir):
    family, path = model_dir
    live = LiveServer(make_engine(path)).start()
    yield family, live
    live.stop()


def test_server_splits_reasoning_streamed_and_not(server):
    family, live = server
    client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=0)
    extra = {"max_thinking_tokens": 4, "ignore_eos": True}
    if family == "qwen3":
        extra["chat_template_kwargs"] = {"enable_thinking": False}
    whole = client.chat.completions.create(
        model=None, messages=MESSAGES, max_tokens=14, temperature=0, extra_body=extra)
    message = whole.choices[0].message
    fields = message.model_extra or {}
    stream = client.chat.completions.create(
        model=None, messages=MESSAGES, max_tokens=14, temperature=0, extra_body=extra,
        stream=True)
    reasoning, content = "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        extra_fields = delta.model_extra or {}
        reasoning += extra_fields.get("reasoning") or ""
        assert (extra_fields.get("reasoning") or None) == (
            extra_fields.get("reasoning_content") or None)
        content += delta.content or ""
    assert (fields.get("reasoning") or "") == reasoning
    assert fields.get("reasoning_content") == fields.get("reasoning")
    assert (message.content or "") == content
    assert "</think>" not in content and "<think>" not in content
    if family == "deepseek_r1":
        # Exactly the 4 thinking tokens are reasoning, the rest is the answer.
        engine = live.engine
        assert engine.tokenizer is not None
        prompt = chat_prompt(engine)
        out, _ = run(engine, "check", prompt, SamplingParams(
            temperature=0.0, max_tokens=14, ignore_eos=True, max_thinking_tokens=4))
        ids = out.outputs[0].token_ids
        assert reasoning == engine.tokenizer.decode(ids[:4]).strip()
        assert content == engine.tokenizer.decode(ids[5:]).lstrip()
    else:
        assert reasoning == ""
    live.assert_pool_whole()


def test_server_rejects_a_bad_effort(server):
    _, live = server
    client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(
            model=None, messages=MESSAGES, max_tokens=4, extra_body={"reasoning_effort": "max"})
