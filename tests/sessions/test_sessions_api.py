"""Sessions over HTTP (a model-free engine) and on the real model (kept vs recomputed KV)."""

from __future__ import annotations

import httpx
import pytest

from heddle.config import CacheConfig, EngineConfig, SchedulerConfig
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from tests.server.fakes import make_engine
from tests.server.live import CACHE, MAX_MODEL_LEN, LiveServer, shared_executor

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    live = LiveServer(make_engine(num_blocks=256, retention="cost")).start()
    yield live
    live.stop()


def _chat(server, messages, headers=None, **fields):
    body = {"messages": messages, "max_tokens": 5, "temperature": 0, **fields}
    return httpx.post(f"{server.base_url}{CHAT}", json=body, headers=headers, timeout=30)


def test_a_session_turn_parks_and_the_next_turn_finds_its_kv(server):
    sessions = server.engine.scheduler.sessions
    user = [{"role": "user", "content": "fix the failing test in the parser module"}]
    first = _chat(server, user, session_id="agent-1", expected_pause=2.5)
    assert first.status_code == 200, first.text
    assert "agent-1" in sessions.parked
    reply = first.json()["choices"][0]["message"]["content"]
    messages = [*user, {"role": "assistant", "content": reply}, {"role": "tool", "content": "ok"}]
    # The next turn names the session in the header instead of the body.
    second = _chat(server, messages, headers={"X-Session-Id": "agent-1"}, close_session=True)
    assert second.status_code == 200, second.text
    usage = second.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= first.json()["usage"][
        "prompt_tokens"
    ] - 4  # all but the partial last block of the first context
    assert "agent-1" not in sessions.parked  # closed: nothing stays parked
    assert server.engine.kv_cache.num_parked_blocks == 0


@pytest.mark.parametrize(
    ("fields", "headers", "param"),
    [
        ({"session_id": "a"}, {"X-Session-Id": "b"}, "session_id"),
        ({"parent_session_id": "p"}, None, "session_id"),
        ({"expected_pause": 1.0}, None, "session_id"),
        ({"session_id": "a", "expected_pause": -1}, None, None),
        ({"session_id": "a", "n": 2}, None, "n"),
        ({"program_deadline": 30.0}, None, "session_id"),
        ({"session_id": "a", "program_deadline": 0}, None, None),
    ],
)
def test_bad_session_fields_are_a_400(server, fields, headers, param):
    response = _chat(server, [{"role": "user", "content": "hi"}], headers=headers, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param
    assert server.engine.kv_cache.num_used_blocks == server.engine.kv_cache.num_parked_blocks


def _engine(caching: bool) -> Engine:
    executor = shared_executor()
    cache = CacheConfig(CACHE.block_size, CACHE.num_blocks, enable_prefix_caching=caching)
    config = EngineConfig(cache=cache, scheduler=SchedulerConfig(retention="cost"))
    return Engine(
        config,
        executor,
        num_blocks=executor.num_blocks,
        tokenizer=executor.tokenizer,
        eos_token_id=executor.eos_token_id,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=executor.model_shape.vocab_size,
    )


def _two_turns(engine: Engine, tag: str) -> tuple[list[int], list[int], int]:
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = tokenizer.encode("The agent reads the file and finds the bug in line", False) * 3
    engine.add_request(f"{tag}-0", prompt, params, session_id=tag)
    first = _finish(engine)
    result = tokenizer.encode(" -> the test passes now. Next step:", False)
    engine.add_request(f"{tag}-1", prompt + first + result, params, session_id=tag)
    request = engine.scheduler.requests[f"{tag}-1"]
    second = _finish(engine)
    cached = request.num_cached_tokens
    engine.check_integrity()
    return first, second, cached


def _finish(engine: Engine) -> list[int]:
    while True:
        for output in engine.step():
            if output.finished:
                return list(output.outputs[0].token_ids)


@pytest.mark.slow
def test_a_dropped_session_recomputes_the_same_greedy_output_as_a_kept_one():
    kept = _engine(caching=True)
    first_kept, second_kept, cached = _two_turns(kept, "kept")
    assert cached >= 32  # the resumed turn found its first context's full blocks
    assert kept.kv_cache.num_parked_blocks > 0  # the session stays parked after its turn
    kept.scheduler.sessions.release_all()
    kept.check_integrity()
    assert kept.kv_cache.num_used_blocks == 0
    dropped = _engine(caching=False)  # nothing kept: every turn recomputes its context
    first_dropped, second_dropped, cached = _two_turns(dropped, "dropped")
    assert cached == 0
    assert (first_dropped, second_dropped) == (first_kept, second_kept)
    assert dropped.kv_cache.num_used_blocks == 0
