"""The engine side of the view: after each step, one `StepRow` and the new decision events.

This is the one seam between the engine and the view. `StepProbe` is installed as the engine's
`step_observer`; it runs on the engine's thread between execute and update (the step's requests
are all still known) and hands plain data to a sink: a `StepRow`, the decision events logged
since the last step, and the wall time the step ended. Whatever carries those across a thread
or a process boundary needs nothing else from the engine.

Gauges that cost a pass over the queues (requests per class and lane, KV blocks per class)
are refreshed every `stride` steps, with the stride chosen so that a pass costs about as much
per step as a step's own batch: long queues are sampled, not walked every step. The cached
free blocks are the pool's own count (`BlockPool.num_cached_free_blocks`): a walk over the free
pool (tens of thousands of blocks on a large GPU's pool) every few steps was most of what
recording a simulation for the view cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from heddle.core.policies.base import DEFAULT_LANE
from heddle.view.series import StepRow

if TYPE_CHECKING:
    from heddle.core.outputs import SchedulerOutput
    from heddle.engine.engine import Engine

# A sink gets (row, new events, wall-clock time the step ended).
StepSink = Callable[[StepRow, list[Any], float], None]

_WALK_BUDGET = 512  # requests a gauge refresh may visit per step, amortized


class StepProbe:
    def __init__(self, engine: Engine, sink: StepSink) -> None:
        self.engine = engine
        self.sink = sink
        # Events logged before the probe was installed (an engine core's warm-up) are not sent.
        log = getattr(engine.scheduler, "events", None)
        self._events_seen = 0 if log is None else log.num_events
        self._evicted_seen = 0 if log is None else log.num_evicted_blocks
        self._steps_to_refresh = 0
        self._running: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._kv_used: dict[str, float] = {}
        self._kv_cached = 0

    def __call__(self, output: SchedulerOutput, start: float, duration: float) -> None:
        engine = self.engine
        scheduler = engine.scheduler
        requests = scheduler.requests
        prefill: dict[str, int] = {}
        decode: dict[str, int] = {}
        for request_id, position, num in zip(
            output.request_ids, output.num_computed_tokens, output.num_new_tokens, strict=True
        ):
            request = requests.get(request_id)
            if request is None:
                cls, prompt = "default", 0
            else:
                cls, prompt = request.request_class, request.num_prompt_tokens
            if position < prompt:
                prefill[cls] = prefill.get(cls, 0) + num
            else:
                decode[cls] = decode.get(cls, 0) + num
        self._steps_to_refresh -= 1
        if self._steps_to_refresh <= 0:
            self._refresh_gauges()
        kv = engine.kv_cache
        events = getattr(scheduler, "events", None)
        new_events: list[Any] = []
        evicted = 0
        if events is not None:
            new_events = events.events_since(self._events_seen)
            self._events_seen = events.num_events
            evicted = events.num_evicted_blocks - self._evicted_seen
            self._evicted_seen = events.num_evicted_blocks
        row = StepRow(
            step_id=output.step_id,
            start=start,
            duration=duration,
            batch=output.num_rows,
            prefill=prefill,
            decode=decode,
            running=self._running,
            waiting=self._waiting,
            kv_used=self._kv_used,
            kv_free=kv.num_free_blocks - min(self._kv_cached, kv.num_free_blocks),
            kv_cached=min(self._kv_cached, kv.num_free_blocks),
            preempted=len(output.preempted_request_ids),
            evicted=evicted,
        )
        self.sink(row, new_events, time.time())

    def _refresh_gauges(self) -> None:
        scheduler = self.engine.scheduler
        kv = self.engine.kv_cache
        lane_of = scheduler.policy.lane_of
        running: dict[str, int] = {}
        held: dict[str, float] = {}
        for request in scheduler.running:
            key = _queue_key(request.request_class, lane_of(request))
            running[key] = running.get(key, 0) + 1
            cls = request.request_class
            held[cls] = held.get(cls, 0.0) + kv.num_request_blocks(request.request_id)
        waiting: dict[str, int] = {}
        for request in scheduler.waiting:
            key = _queue_key(request.request_class, lane_of(request))
            waiting[key] = waiting.get(key, 0) + 1
        # Blocks shared by several requests (a common prefix) are split among their holders.
        total_held = sum(held.values())
        used = kv.num_used_blocks
        scale = used / total_held if total_held else 0.0
        # Rounded here, once a refresh, not in every row's `to_list` (the same dict each step).
        self._kv_used = {cls: round(blocks * scale, 2) for cls, blocks in held.items()}
        self._running, self._waiting = running, waiting
        self._kv_cached = kv.pool.num_cached_free_blocks
        visited = len(scheduler.running) + len(scheduler.waiting)
        self._steps_to_refresh = max(1, visited // _WALK_BUDGET)


def _queue_key(request_class: str, lane: str) -> str:
    if lane in (DEFAULT_LANE, request_class):
        return request_class
    return f"{request_class}/{lane}"
