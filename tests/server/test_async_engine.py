"""AsyncEngine over a model-free engine: streams, abort, errors, idling and shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from heddle.engine.async_engine import AsyncEngine, EngineDeadError, EngineStepError
from heddle.errors import InvalidRequestError, QueueFullError
from heddle.request import SamplingParams
from tests.server.fakes import CycleExecutor, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


async def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_stream_yields_outputs_in_order_and_frees_blocks():
    engine = make_engine()
    async_engine = AsyncEngine(engine)

    async def main():
        stream = await async_engine.add_request("r", [ord(c) for c in "hello"], GREEDY)
        return [out async for out in stream]

    outputs = run(main())
    async_engine.shutdown()
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert "".join(o.outputs[0].delta_text for o in outputs) == "fghij"
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert engine.kv_cache.num_used_blocks == 0
    engine.check_integrity()


def test_add_request_raises_the_engines_errors():
    async_engine = AsyncEngine(make_engine(max_model_len=16, max_waiting=0))

    async def main():
        with pytest.raises(InvalidRequestError, match="context"):
            await async_engine.add_request("long", [97] * 40, GREEDY)
        with pytest.raises(QueueFullError):
            await async_engine.add_request("full", [97] * 4, GREEDY)

    run(main())
    async_engine.shutdown()


def test_abort_ends_the_stream_and_returns_every_block():
    engine = make_engine(step_time=0.01)
    async_engine = AsyncEngine(engine)
    params = SamplingParams(max_tokens=200, ignore_eos=True)

    async def main():
        stream = await async_engine.add_request("r", [97] * 30, params)
        first = await stream.__anext__()
        assert engine.kv_cache.num_used_blocks > 0
        async_engine.abort("r")
        rest = [out async for out in stream]
        return first, rest

    first, rest = run(main())
    async_engine.shutdown()
    assert not first.finished
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert engine.kv_cache.num_used_blocks == 0
    engine.check_integrity()


def test_leaving_generate_early_aborts_the_request():
    engine = make_engine(step_time=0.01)
    async_engine = AsyncEngine(engine)

    async def main():
        params = SamplingParams(max_tokens=200, ignore_eos=True)
        async for _ in async_engine.generate("r", [97] * 30, params):
            break
        await wait_until(lambda: async_engine.stats.kv_blocks_used == 0)

    run(main())
    async_engine.shutdown()
    engine.check_integrity()
    assert not engine.has_unfinished_requests()


def test_a_failing_step_fails_every_stream_and_the_engine_recovers():
    engine = make_engine()
    executor = engine.executor
    assert isinstance(executor, CycleExecutor)
    executor.fail_on_token = ord("h")
    async_engine = AsyncEngine(engine)

    async def consume(request_id):
        return [out async for out in await async_engine.add_request(request_id, [97] * 5, GREEDY)]

    async def main():
        results = await asyncio.gather(consume("a"), consume("b"), return_exceptions=True)
        assert all(isinstance(r, EngineStepError) for r in results), results
        executor.fail_on_token = None
        return await consume("c")

    outputs = run(main())
    async_engine.shutdown()
    assert outputs[-1].finished
    engine.check_integrity()
    assert engine.kv_cache.num_used_blocks == 0


def test_the_loop_sleeps_when_idle():
    engine = make_engine()
    async_engine = AsyncEngine(engine)
    calls = 0
    step = engine.step

    def counting_step():
        nonlocal calls
        calls += 1
        return step()

    engine.step = counting_step  # type: ignore[method-assign]

    async def main():
        async for _ in async_engine.generate("r", [97] * 5, GREEDY):
            pass

    run(main())
    busy_calls = calls
    time.sleep(0.2)
    assert calls == busy_calls == 5
    async_engine.shutdown()


def test_shutdown_aborts_in_flight_requests_and_refuses_new_ones():
    engine = make_engine(step_time=0.01)
    async_engine = AsyncEngine(engine)
    params = SamplingParams(max_tokens=200, ignore_eos=True)

    async def main():
        stream = await async_engine.add_request("r", [97] * 5, params)
        await stream.__anext__()
        await async_engine.shutdown_async()
        outputs = [out async for out in stream]
        assert outputs[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(EngineDeadError):
            await async_engine.add_request("late", [97] * 5, params)

    run(main())
    assert not async_engine.is_running
    engine.check_integrity()


def test_listeners_get_every_record_once():
    engine = make_engine()
    async_engine = AsyncEngine(engine)
    seen = []
    async_engine.add_listener(lambda records, steps: seen.extend(r.request_id for r in records))

    async def main():
        params = SamplingParams(n=2, max_tokens=3, ignore_eos=True)
        await asyncio.gather(
            *(
                asyncio.create_task(_drain(async_engine.generate(f"r{i}", [97] * 5, params)))
                for i in range(3)
            )
        )

    run(main())
    async_engine.shutdown()
    assert sorted(seen) == sorted(f"r{i}-{j}" for i in range(3) for j in range(2))
    assert engine.finished_records == []  # handed over, not kept


async def _drain(iterator):
    async for _ in iterator:
        pass


def test_a_request_with_n_sequences_is_admitted_whole_or_not_at_all():
    engine = make_engine(max_waiting=2)
    async_engine = AsyncEngine(engine)

    async def main():
        with pytest.raises(QueueFullError):
            await async_engine.add_request("g", [97] * 5, SamplingParams(n=3, max_tokens=2))
        outputs = [o async for o in async_engine.generate("ok", [97] * 5, GREEDY)]
        assert outputs[-1].finished

    run(main())
    async_engine.shutdown()
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
