"""The cluster front end over in-process replicas: routing, failover at the exact token, 503s."""

from __future__ import annotations

import asyncio

import pytest

from heddle.engine.async_engine import EngineDeadError
from heddle.errors import InvalidRequestError
from heddle.request import SamplingParams
from tests.cluster.fakes import local_cluster

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def prompt(i: int) -> list[int]:
    return [ord(c) for c in f"request number {i}: "]


async def collect(engine, request_id, prompt_ids, params=GREEDY, on_token=None):
    stream = await engine.add_request(request_id, prompt_ids, params)
    text, final = "", None
    async for output in stream:
        completion = output.outputs[0]
        text += completion.delta_text
        if on_token is not None and completion.delta_token_ids:
            await on_token(len(completion.token_ids))
        if output.finished:
            final = output
    return text, final


async def run_all(engine, n, on_token=None):
    return await asyncio.gather(
        *(collect(engine, f"r{i}", prompt(i), on_token=on_token) for i in range(n))
    )


def test_requests_spread_and_complete() -> None:
    async def main():
        engine, replicas = local_cluster(2)
        results = await run_all(engine, 8)
        await engine.shutdown_async()
        return replicas, results

    replicas, results = asyncio.run(main())
    assert all(len(final.outputs[0].token_ids) == 40 for _, final in results)
    assert all(final.outputs[0].finish_reason == "length" for _, final in results)
    assert sorted(len(r.requests) for r in replicas)[0] >= 3  # both replicas took a share
    assert all(r.idle() for r in replicas)


def test_kill_mid_stream_loses_and_repeats_no_token() -> None:
    async def main():
        calm_engine, _ = local_cluster(2, step_time=0.004)
        calm = await run_all(calm_engine, 16)
        await calm_engine.shutdown_async()

        engine, replicas = local_cluster(2, step_time=0.004)

        async def kill_once(num_tokens: int) -> None:
            if num_tokens >= 10 and not replicas[0].dead:
                replicas[0].kill()

        moved = await run_all(engine, 16, on_token=kill_once)
        survivors_idle = replicas[1].idle()
        await engine.shutdown_async()
        return calm, moved, engine, survivors_idle

    calm, moved, engine, survivors_idle = asyncio.run(main())
    assert engine.num_failovers >= 1
    for (calm_text, calm_final), (text, final) in zip(calm, moved, strict=True):
        assert text == calm_text  # streamed deltas: nothing lost, nothing repeated
        assert final.outputs[0].token_ids == calm_final.outputs[0].token_ids
        record = final.outputs[0].metrics
        assert len(record.token_times) == 40
    assert survivors_idle


def test_a_restarted_replica_is_taken_back() -> None:
    async def main():
        engine, replicas = local_cluster(2)
        engine.start()
        replicas[0].kill()
        await engine.check_health()
        down = engine.router.replicas[0].healthy
        results = await run_all(engine, 4)
        replicas[0].restart()
        await engine.check_health()
        up = engine.router.replicas[0].healthy
        more = await run_all(engine, 4)
        await engine.shutdown_async()
        return down, up, results, more, replicas

    down, up, results, more, replicas = asyncio.run(main())
    assert down is False and up is True
    assert all(len(f.outputs[0].token_ids) == 40 for _, f in results + more)
    assert replicas[0].requests  # it served some of the later requests


def test_no_healthy_replica_is_a_503_and_bad_input_a_400() -> None:
    async def main():
        engine, replicas = local_cluster(2)
        with pytest.raises(InvalidRequestError, match="context"):
            await engine.add_request("big", [65] * 300, GREEDY)
        for r in replicas:
            r.kill()
        with pytest.raises(EngineDeadError, match="no healthy replica"):
            await engine.add_request("x", prompt(0), GREEDY)
        error = engine.error
        await engine.shutdown_async()
        return error

    assert isinstance(asyncio.run(main()), EngineDeadError)


def test_stop_strings_are_found_by_the_front_end() -> None:
    async def main():
        engine, _ = local_cluster(1)
        params = SamplingParams(max_tokens=40, temperature=0.0, stop=("efg",), ignore_eos=True)
        text, final = await collect(engine, "s", prompt(1), params)
        await engine.shutdown_async()
        return text, final

    text, final = asyncio.run(main())
    assert final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].stop_reason == "efg"
    assert "efg" not in text and text == final.outputs[0].text


def test_abort_frees_the_replica() -> None:
    async def main():
        engine, replicas = local_cluster(1, step_time=0.01)
        stream = await engine.add_request("a", prompt(0), GREEDY)
        await anext(stream)
        engine.abort("a")
        outputs = [o async for o in stream]
        await asyncio.sleep(0.1)
        idle = replicas[0].idle()
        await engine.shutdown_async()
        return outputs, idle

    outputs, idle = asyncio.run(main())
    assert outputs[-1].outputs[0].finish_reason == "abort"
    assert idle
