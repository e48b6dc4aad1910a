"""CoreClient over a real engine core process running the model-free engine of tests/server.

Each test starts its own core process (a fresh Python without torch: about 0.2 s).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import pytest

from heddle.engine.async_engine import EngineDeadError, EngineStepError
from heddle.engine.core_client import CoreClient
from heddle.errors import HeddleError, InvalidRequestError, QueueFullError
from heddle.request import SamplingParams
from tests.server.fakes import make_engine, slow_restart_engine, step_counter, unloadable_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, ignore_eos=True)
HELLO = [ord(c) for c in "hello"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


async def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def with_core(test, **engine_options):
    """Run `test(client)` against a started core; always shut it down."""

    async def main():
        client = CoreClient(functools.partial(make_engine, **engine_options))
        await client.start_async()
        try:
            return await test(client)
        finally:
            await client.shutdown_async()
            assert client.core_pid is None or not _alive(client.core_pid)

    return run(main())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (the client reaps it on close).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


async def _collect(client, request_id, prompt, params):
    return [o async for o in client.generate(request_id, prompt, params)]


def test_the_core_streams_detokenized_outputs_and_frees_its_blocks():
    async def test(client):
        assert client.model_name == "fake-model" and client.max_model_len == 256
        assert client.core_pid != os.getpid()
        outputs = await _collect(client, "r", HELLO, GREEDY)
        await wait_until(lambda: client.stats.num_steps >= 5)
        return outputs, client.stats

    outputs, stats = with_core(test)
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert "".join(o.outputs[0].delta_text for o in outputs) == "fghij"
    assert outputs[-1].outputs[0].text == "fghij"
    assert outputs[-1].outputs[0].token_ids == [ord(c) for c in "fghij"]
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert stats.kv_blocks_used == 0 and stats.num_running == 0


def test_a_stop_string_found_by_the_front_end_ends_the_sequence_in_the_core():
    params = SamplingParams(max_tokens=100, ignore_eos=True, stop=("ij",))

    async def test(client):
        outputs = await _collect(client, "s", HELLO, params)
        # The core ended it: no more steps, every block back.
        await wait_until(lambda: client.stats.num_running == 0 and client.stats.kv_blocks_used == 0)
        steps = client.stats.num_steps
        await asyncio.sleep(0.05)
        assert client.stats.num_steps == steps
        return outputs

    outputs = with_core(test)
    deltas = [o.outputs[0].delta_text for o in outputs]
    assert "".join(deltas) == "fgh"
    assert all("i" not in d for d in deltas)  # the start of the stop string was held back
    final = outputs[-1].outputs[0]
    assert (final.finish_reason, final.stop_reason, final.text) == ("stop", "ij", "fgh")


def test_n_sequences_logprobs_and_a_batch_of_requests():
    params = SamplingParams(n=3, max_tokens=4, ignore_eos=True, logprobs=1)

    async def test(client):
        return await asyncio.gather(
            *(_collect(client, f"g{i}", [97] * 5, params) for i in range(4))
        )

    for outputs in with_core(test):
        final = outputs[-1]
        assert final.finished
        assert [c.index for c in final.outputs] == [0, 1, 2]
        for c in final.outputs:
            assert c.text == "fghi" and c.finish_reason == "length"
            assert [lp.token_id for lp in c.logprobs] == [ord(ch) for ch in "fghi"]


def test_the_cores_errors_come_back_as_the_engines_exceptions():
    async def test(client):
        with pytest.raises(InvalidRequestError, match="context"):
            await client.add_request("long", [97] * 300, GREEDY)
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            await client.add_request("bad", [-1], GREEDY)
        with pytest.raises(QueueFullError):
            await client.add_request("g", [97] * 5, SamplingParams(n=3, max_tokens=2))
        outputs = await _collect(client, "ok", HELLO, GREEDY)
        assert outputs[-1].finished

    with_core(test, max_waiting=2)


def test_abort_frees_the_blocks_within_a_step():
    async def test(client):
        stream = await client.add_request("r", [97] * 30, LONG)
        await stream.__anext__()
        await wait_until(lambda: client.stats.kv_blocks_used > 0)
        client.abort("r")
        rest = [o async for o in stream]
        await wait_until(lambda: client.stats.kv_blocks_used == 0)
        return rest

    rest = with_core(test, step_time=0.01)
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"


def test_a_failing_step_fails_its_requests_and_the_core_serves_on():
    async def test(client):
        results = await asyncio.gather(
            _collect(client, "a", [97] * 5, GREEDY),
            _collect(client, "b", [97] * 5, GREEDY),
            return_exceptions=True,
        )
        assert all(isinstance(r, EngineStepError) for r in results), results
        # Prompts that never reach the failing letter still run.
        return await _collect(client, "c", [97] * 5, SamplingParams(max_tokens=1))

    outputs = with_core(test, fail_on_token=ord("h"))
    assert outputs[-1].finished


def test_killing_the_core_fails_every_request_then_a_new_core_serves():
    async def test(client):
        first_pid = client.core_pid
        tasks = [asyncio.ensure_future(_collect(client, f"k{i}", [97] * 5, LONG)) for i in range(6)]
        await wait_until(lambda: client.stats.num_running == 6)
        os.kill(first_pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert "exited" in str(results[0])
        # Unhealthy until the new core is up; new requests are refused meanwhile.
        assert client.error is not None
        with pytest.raises(EngineDeadError):
            await client.add_request("during", HELLO, GREEDY)
        await wait_until(lambda: client.error is None)
        assert client.core_pid != first_pid and client.num_restarts == 1
        outputs = await _collect(client, "after", HELLO, GREEDY)
        await wait_until(lambda: client.stats.num_steps >= 5)
        return outputs, client.stats

    outputs, stats = with_core(test, step_time=0.01)
    assert outputs[-1].outputs[0].text == "fghij"
    assert stats.kv_blocks_used == 0


def test_a_sigterm_to_the_process_group_lets_the_front_end_drain_first():
    """`timeout`, `kill -- -PGID` or a service manager SIGTERM the front end and its core at
    once: the core serves on (no failed request, no restart) until the front end's Shutdown."""

    async def test(client):
        pid = client.core_pid
        stream = await client.add_request("r", HELLO, SamplingParams(max_tokens=40))
        await stream.__anext__()
        os.kill(pid, signal.SIGTERM)
        outputs = [o async for o in stream]
        await asyncio.sleep(0.2)  # a core that died of it would be seen (and restarted) by now
        assert client.is_running and client.core_pid == pid and client.num_restarts == 0
        return outputs, pid

    outputs, pid = with_core(test, step_time=0.01)
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert not _alive(pid)  # the Shutdown ended it


def test_a_core_sigtermed_alone_exits_after_its_grace_and_is_restarted():
    async def main():
        client = CoreClient(functools.partial(make_engine), term_grace=0.3)
        await client.start_async()
        try:
            pid = client.core_pid
            os.kill(pid, signal.SIGTERM)  # no Shutdown follows
            await wait_until(lambda: client.num_restarts == 1 and client.error is None)
            assert client.core_pid != pid and not _alive(pid)
            return await _collect(client, "after", HELLO, GREEDY)
        finally:
            await client.shutdown_async()

    outputs = run(main())
    assert outputs[-1].outputs[0].text == "fghij"
    with pytest.raises(ValueError, match="term_grace"):
        CoreClient(functools.partial(make_engine), term_grace=0)


def test_a_shutdown_during_a_restart_stops_the_core_still_loading(tmp_path):
    """The core dies, the client starts another (its model loads for 20 s), the server shuts
    down: the loading core is killed and the shutdown does not wait for its load."""
    pid_file = tmp_path / "restart.pid"
    restarted: list[int] = []

    async def main():
        client = CoreClient(functools.partial(slow_restart_engine, str(tmp_path)))
        await client.start_async()
        os.kill(client.core_pid, signal.SIGKILL)
        await wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
        restarted.append(int(pid_file.read_text()))
        await client.shutdown_async()
        assert client.num_restarts == 0

    start = time.monotonic()
    try:
        run(main())  # asyncio.run also waits for the restart's thread
        assert time.monotonic() - start < 10
        assert restarted and not _alive(restarted[0])
    finally:
        if restarted and _alive(restarted[0]):  # the fix failed: do not leave it behind
            os.kill(restarted[0], signal.SIGKILL)


def test_shutdown_aborts_in_flight_requests_and_refuses_new_ones():
    async def main():
        client = CoreClient(functools.partial(make_engine, step_time=0.01))
        await client.start_async()
        pid = client.core_pid
        stream = await client.add_request("r", HELLO, LONG)
        await stream.__anext__()
        await client.shutdown_async()
        outputs = [o async for o in stream]
        assert outputs[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(EngineDeadError):
            await client.add_request("late", HELLO, LONG)
        assert not _alive(pid)

    run(main())


def test_listeners_get_the_cores_records_and_step_stats():
    seen: list[str] = []
    steps: list[int] = []

    async def test(client):
        client.add_listener(
            lambda records, stats: (
                seen.extend(r.request_id for r in records),
                steps.extend(s.step_id for s in stats),
            )
        )
        params = SamplingParams(n=2, max_tokens=3, ignore_eos=True)
        await asyncio.gather(*(_collect(client, f"r{i}", [97] * 5, params) for i in range(3)))
        await wait_until(lambda: len(seen) == 6)

    with_core(test)
    assert sorted(seen) == sorted(f"r{i}-{j}" for i in range(3) for j in range(2))
    assert steps and steps == sorted(steps)


def test_a_core_that_cannot_start_is_a_clear_error():
    client = CoreClient(unloadable_engine)
    with pytest.raises(HeddleError, match="no model at /nowhere") as error:
        client.start()
    assert not isinstance(error.value, EngineDeadError)  # the user's mistake, said in one line
    client.shutdown()


_FRONT_END = """
import asyncio, functools, sys
from heddle.engine.core_client import CoreClient
from tests.server.fakes import make_engine

async def main():
    client = CoreClient(functools.partial(make_engine))
    await client.start_async()
    print(client.core_pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_the_core_exits_when_its_front_end_is_killed():
    import subprocess
    import sys

    front = subprocess.Popen([sys.executable, "-c", _FRONT_END], stdout=subprocess.PIPE, text=True)
    core_pid = None
    try:
        assert front.stdout is not None
        core_pid = int(front.stdout.readline())
        _kill_front_end_then_wait_for_the_core(front, core_pid, 10, "the orphaned core still runs")
    finally:
        _clean_up(front, core_pid)


def _kill_front_end_then_wait_for_the_core(front, core_pid: int, within: float, why: str) -> None:
    """SIGKILL the front end (no goodbye to its core) and require the core gone in `within` s."""
    assert _alive(core_pid)
    front.send_signal(signal.SIGKILL)
    front.wait(10)
    deadline = time.monotonic() + within
    while _alive(core_pid):
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def _clean_up(front, core_pid: int | None) -> None:
    front.kill()
    front.wait()
    if core_pid is not None and _alive(core_pid):  # the fix failed: do not leave it behind
        os.kill(core_pid, signal.SIGKILL)


_STARTING_FRONT_END = """
import functools, sys
from heddle.engine.core_client import CoreClient
from tests.server.fakes import slow_engine

CoreClient(functools.partial(slow_engine, sys.argv[1])).start()  # blocks while the core loads
"""


def test_the_core_exits_when_its_front_end_is_killed_while_it_starts(tmp_path):
    """`heddle serve` killed while its model loads: the core, busy loading, must not stay."""
    import subprocess
    import sys

    pid_file = tmp_path / "core.pid"
    front = subprocess.Popen([sys.executable, "-c", _STARTING_FRONT_END, str(pid_file)])
    core_pid = None
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert front.poll() is None, "the front end exited before its core started loading"
            assert time.monotonic() < deadline, "the core never started loading"
            time.sleep(0.02)
        core_pid = int(pid_file.read_text())
        _kill_front_end_then_wait_for_the_core(front, core_pid, 5, "the orphaned core still loads")
    finally:
        _clean_up(front, core_pid)


def test_per_step_events_reach_the_event_listeners():
    seen: list[dict] = []

    async def main():
        client = CoreClient(functools.partial(make_engine), event_source=step_counter)
        client.add_event_listener(seen.extend)
        await client.start_async()
        try:
            await _collect(client, "r", HELLO, GREEDY)
            await wait_until(lambda: len(seen) >= 5)
        finally:
            await client.shutdown_async()

    run(main())
    assert [e["num_steps"] for e in seen] == list(range(1, len(seen) + 1))
