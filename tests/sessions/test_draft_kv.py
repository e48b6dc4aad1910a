"""A draft model's KV of a paused agent session (heddle/sessions/draft_kv.py): the orders the
session manager gives, the executor-side bookkeeping against a small fake proposer, and, on a
tiny real target and draft, that a resumed turn takes its draft KV (the draft computes only the
new tokens), gives the greedy output of the same turns without parking or without speculation,
and leaves no block behind in either pool."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from heddle.clock import VirtualClock
from heddle.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from heddle.config import SpeculativeConfig as Spec
from heddle.engine.engine import Engine
from heddle.request import SamplingParams
from heddle.sessions.draft_kv import DraftOrder, DraftOrderKind, DraftSessions, parked_key
from heddle.sim.executor import SimulatedExecutor
from heddle.sim.roofline import RooflineCostModel
from tests.model.test_tiny_models import qwen3

K = DraftOrderKind


class FakeDraft:
    """The proposer's side DraftSessions uses: states by id, each holding some blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.held: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - sum(self.held.values())

    def rename(self, old_id: str, new_id: str) -> bool:
        if old_id not in self.held:
            return False
        self.held[new_id] = self.held.pop(old_id)
        return True

    def blocks_held(self, request_id: str) -> int:
        return self.held.get(request_id, 0)

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.held.pop(request_id, None)


def test_parked_draft_kv_is_renamed_resumed_and_ended():
    draft, sessions = FakeDraft(10), DraftSessions()
    draft.held = {"a-0": 3, "b-0": 2, "x": 1}
    sessions.apply([DraftOrder(K.PARK, "a", "a-0"), DraftOrder(K.PARK, "b", "b-0")], draft)
    assert draft.held == {parked_key("a"): 3, parked_key("b"): 2, "x": 1}
    assert sessions.num_parked_blocks(draft) == 5
    sessions.apply([DraftOrder(K.RESUME, "a", "a-1"), DraftOrder(K.END, "b")], draft)
    assert draft.held == {"a-1": 3, "x": 1} and not sessions.parked
    assert (sessions.stats.num_parked, sessions.stats.num_resumed, sessions.stats.num_ended) == (
        2, 1, 1)  # fmt: skip
    # A turn whose draft KV is gone (the executor had forgotten it) parks nothing.
    sessions.apply([DraftOrder(K.PARK, "c", "c-0")], draft)
    assert not sessions.parked


def test_under_pressure_sessions_whose_target_kv_left_give_way_first_oldest_first():
    draft, sessions = FakeDraft(12), DraftSessions()
    draft.held = {"a-0": 3, "b-0": 3, "c-0": 3}
    sessions.apply([DraftOrder(K.PARK, s, f"{s}-0") for s in "abc"], draft)
    sessions.apply([DraftOrder(K.TARGET_OUT, "c"), DraftOrder(K.TARGET_OUT, "b"),
                    DraftOrder(K.TARGET_POOL, "b")], draft)  # b came back from the tier
    assert sessions.release_order() == ["c", "a", "b"]
    assert draft.num_free_blocks == 3
    assert sessions.make_room(3, draft) == 0  # enough already: nothing dropped
    assert sessions.make_room(5, draft) == 3 and list(sessions.parked) == ["a", "b"]
    assert sessions.make_room(12, draft) == 6 and not sessions.parked
    assert sessions.stats.num_dropped_pressure == 3 and draft.held == {}


def _sim_engine(retention: str, max_park_seconds: float = 600.0) -> Engine:
    config = EngineConfig(
        cache=CacheConfig(block_size=4, num_blocks=64),
        scheduler=SchedulerConfig(retention=retention, max_park_seconds=max_park_seconds),
    )
    clock = VirtualClock()
    executor = SimulatedExecutor(RooflineCostModel("llama-3.1-8b", "h100"), clock, vocab_size=500)
    engine = Engine(config, executor, num_blocks=64, clock=clock)
    engine.scheduler.sessions.track_draft()
    return engine


def _run(engine: Engine, request_id: str, prompt: list[int], **session: object) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request(request_id, prompt, params, **session)  # type: ignore[arg-type]
    for _ in range(100):
        for output in engine.step():
            if output.finished:
                return list(output.outputs[0].token_ids)
    raise AssertionError("did not finish")


def test_the_session_manager_orders_follow_the_sessions_turns():
    engine = _sim_engine("cost")
    orders: list[DraftOrder] = []
    original = engine.executor.execute

    def execute(so):  # what the executor is told, step by step
        orders.extend(so.draft_session_orders)
        return original(so)

    engine.executor.execute = execute  # type: ignore[method-assign]
    first = _run(engine, "s-0", list(range(1, 14)), session_id="s")
    second = _run(engine, "s-1", list(range(1, 14)) + first + [7, 8], session_id="s")
    _run(engine, "s-2", list(range(1, 14)) + first + [7, 8] + second + [9], session_id="s",
         close_session=True)
    _run(engine, "other", [5, 6, 7])  # a step that runs after the last turn: it carries END
    kinds = [(o.kind, o.request_id) for o in orders]
    assert kinds[:2] == [(K.PARK, "s-0"), (K.RESUME, "s-1")]
    assert kinds[2] == (K.PARK, "s-1") and kinds[3] == (K.RESUME, "s-2")
    assert (K.END, None) not in kinds  # the last turn took the draft KV: nothing left to end
    assert engine.scheduler.sessions.draft_orders == []
    # No orders without a draft model, none with `lru` (no session parks).
    lru = _sim_engine("lru")
    _run(lru, "t-0", [1, 2, 3, 4, 5], session_id="t")
    assert lru.scheduler.sessions.draft_orders == []


def test_a_paused_sessions_draft_kv_ends_at_close_and_at_the_hard_limit():
    engine = _sim_engine("cost", max_park_seconds=5.0)
    sessions = engine.scheduler.sessions
    _run(engine, "a-0", list(range(1, 10)), session_id="a")
    _run(engine, "b-0", list(range(1, 10)), session_id="b")
    assert sessions.close("a")
    assert [(o.kind, o.session_id) for o in sessions.draft_orders][-1] == (K.END, "a")
    engine.clock.advance(6.0)  # b's draft KV outlives no limit
    sessions.expire(engine.clock.now())
    assert [(o.kind, o.session_id) for o in sessions.draft_orders][-1] == (K.END, "b")
    assert not sessions.close("b")  # nothing of it is held any more


# -- the real model -------------------------------------------------------------------------
NUM_BLOCKS = 24  # 4-token blocks


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    torch.manual_seed(21)
    target = qwen3().eval()
    target_path = tmp_path_factory.mktemp("target")
    target.save_pretrained(target_path)
    generator = torch.Generator().manual_seed(22)
    with torch.no_grad():  # the draft: the target with noise (agrees often, not always)
        for param in target.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1 * param.std())
    draft_path = tmp_path_factory.mktemp("draft")
    target.save_pretrained(draft_path)
    return target_path, draft_path


def _engine(target: Path, draft: Path | None, retention: str) -> Engine:
    speculation = Spec(method="draft", model=str(draft), num_draft_tokens=3, adaptive=False) \
        if draft is not None else Spec()
    config = EngineConfig(
        model=ModelConfig(model=str(target), dtype="float32", quantization="none"),
        cache=CacheConfig(block_size=4, num_blocks=NUM_BLOCKS),
        scheduler=SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, retention=retention,
                                  speculation=speculation),
    )
    return Engine.from_config(config)


def _turns(engine: Engine) -> tuple[list[list[int]], int]:
    """Three turns of one session, the next prompt = context + output + a tool result; returns
    the outputs and the tokens the draft model computed for the last turn (its forward rows)."""
    context = [5, 17, 300, 42, 8, 99, 250, 11, 12, 13, 7, 7, 400, 123]
    proposer = getattr(engine.executor, "draft", None)
    counted = [0]
    if proposer is not None:
        compute = proposer.executor.compute_logits

        def counting(output):
            counted[0] += output.num_scheduled_tokens
            return compute(output)

        proposer.executor.compute_logits = counting
    outputs = []
    for turn in range(3):
        counted[0] = 0
        out = _run(engine, f"s-{turn}", context, session_id="s")
        outputs.append(out)
        context = context + out + [61, 2, 33 + turn]
    return outputs, counted[0]


@pytest.mark.slow
def test_a_resumed_turn_with_a_draft_model_keeps_its_draft_kv_and_its_greedy_output(models):
    target, draft = models
    plain, _ = _turns(_engine(target, None, "cost"))  # no speculation
    dropped_engine = _engine(target, draft, "lru")  # the draft's KV goes with each turn
    dropped, dropped_computed = _turns(dropped_engine)
    engine = _engine(target, draft, "cost")
    kept, kept_computed = _turns(engine)
    assert kept == dropped == plain
    executor = engine.executor
    sessions = executor.draft_sessions  # type: ignore[attr-defined]
    assert sessions.stats.num_resumed == 2 and sessions.stats.num_dropped_pressure == 0
    # The last turn's context is 14 + 2 x (3 + 3) = 26 tokens: without its draft KV the draft
    # model computes all of them again; with it, only the new ones (and its own drafts).
    assert dropped_computed >= 26
    assert kept_computed < dropped_computed - 10
    # Closing the session frees its parked KV in both pools (the draft's with the next step).
    assert engine.close_session("s")
    _run(engine, "after", [1, 2, 3])
    _run(engine, "after-2", [4, 5, 6])  # the step after `after` finished forgets its draft KV
    proposer = executor.draft  # type: ignore[attr-defined]
    assert not sessions.parked and proposer.request_ids == ["after-2"]
    assert proposer.num_free_blocks == proposer.executor.num_blocks - proposer.blocks_held(
        "after-2")  # fmt: skip
    engine.check_integrity()
    assert engine.kv_cache.num_used_blocks == 0


def _pressure_run(engine: Engine) -> tuple[list[list[int]], list[str]]:
    """Sessions a and b park (each ~7 draft blocks of the 24), then a long request needs more
    draft blocks than are free, then a and b resume."""
    a, b = list(range(30, 50)), list(range(60, 80))
    outs = [_run(engine, "a-0", a, session_id="a"), _run(engine, "b-0", b, session_id="b")]
    outs.append(_run(engine, "long", list(range(100, 148))))
    sessions = getattr(engine.executor, "draft_sessions", None)
    parked = list(sessions.parked) if sessions is not None else []
    outs.append(_run(engine, "a-1", a + outs[0] + [7, 8], session_id="a"))
    outs.append(_run(engine, "b-1", b + outs[1] + [9], session_id="b", close_session=True))
    return outs, parked


@pytest.mark.slow
def test_paused_draft_kv_gives_way_to_a_proposal_oldest_first_and_outputs_stay(models):
    target, draft = models
    plain, _ = _pressure_run(_engine(target, None, "cost"))
    engine = _engine(target, draft, "cost")
    outs, parked_after_long = _pressure_run(engine)
    assert outs == plain
    sessions = engine.executor.draft_sessions  # type: ignore[attr-defined]
    # The long request's proposals needed the room: a's draft KV (the oldest) gave way, b's
    # stayed and was taken by b's next turn; a's next turn ran its draft over its context.
    assert sessions.stats.num_dropped_pressure == 1 and parked_after_long == ["b"]
    assert sessions.stats.num_resumed == 1
    engine.close_session("a")
    _run(engine, "after", [1, 2, 3])
    _run(engine, "after-2", [4, 5, 6])
    proposer = engine.executor.draft  # type: ignore[attr-defined]
    assert not sessions.parked and proposer.request_ids == ["after-2"]
    engine.check_integrity()
    assert engine.kv_cache.num_used_blocks == 0
