"""The live dashboard of `heddle serve`: the probe on the engine, a bounded store, the routes.

The probe (heddle/view/probe.py) runs where the engine runs and hands plain data to a sink: a
`StepRow`, the decision events of the step, the wall time it ended.
- An engine core in its own process (the default): `view_source` is the core's event source
  (`CoreClient(event_source=view_source)`). In the core it installs the probe and, after each
  pass of the core loop, returns the pass's steps as plain lists and dicts; they ride in the
  `StepBatch` to the front end, whose `LiveView` puts them into the store. Finished records
  come over the client's record listener, as /metrics gets them.
- An engine in a thread of this process (`AsyncEngine`): the probe's sink is the store.
Times stay on the engine's clock (`WallClock`: CLOCK_MONOTONIC, one clock for every process of
a machine); the store shows them from the moment the view started.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from heddle.engine.async_engine import AsyncEngine
from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat
from heddle.view.probe import StepProbe
from heddle.view.routes import make_router
from heddle.view.series import StepRow
from heddle.view.store import Limits, ViewStore, event_to_dict

if TYPE_CHECKING:
    from heddle.engine.engine import Engine

VIEW_MESSAGE = "heddle.view"  # the key that marks the view's messages among a core's events


def engine_info(engine: Engine) -> dict[str, Any]:
    config = engine.config.scheduler
    return {
        "policy": config.policy,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "num_blocks": engine.kv_cache.num_blocks,
        "block_size": engine.kv_cache.block_size,
    }


def view_source(engine: Engine) -> Callable[[], list[Any]]:
    """In an engine core's process: install the probe on `engine`; return what the core sends
    after each pass (one message with the pass's steps, or nothing when no step ran)."""
    pending: list[list[Any]] = []

    def sink(row: StepRow, events: list[Any], wall: float) -> None:
        pending.append([row.to_list(), [event_to_dict(e) for e in events], wall])

    engine.step_observer = StepProbe(engine, sink)
    info = engine_info(engine)

    def drain() -> list[Any]:
        if not pending:
            return []
        steps = pending[:]
        pending.clear()
        return [{VIEW_MESSAGE: 1, "info": info, "steps": steps}]

    return drain


def _shift(event: dict[str, Any], origin: float) -> dict[str, Any]:
    """An event converted on the engine's clock, moved onto the view's."""
    for key in ("t", "t0", "t1"):
        if event.get(key) is not None:
            event[key] = round(event[key] - origin, 6)
    return event


class LiveView:
    """The store of a live server, fed by an in-process engine's probe or a core's messages."""

    def __init__(self, client: Any, *, title: str, limits: Limits | None = None) -> None:
        self.client = client
        engine = client.engine if isinstance(client, AsyncEngine) else None
        self.store = ViewStore(
            mode="live",
            title=title,
            limits=limits or Limits(),
            origin=engine.clock.now() if engine is not None else time.monotonic(),
            info=engine_info(engine) if engine is not None else {},
        )
        client.add_listener(self._on_records)
        if engine is not None:
            self.store.series.kv_total = engine.kv_cache.num_blocks
            engine.step_observer = StepProbe(engine, self._on_step)
        else:
            client.add_event_listener(self._on_core_events)

    def _on_step(self, row: StepRow, events: list[Any], wall: float) -> None:
        """On the engine thread, once per step."""
        self.store.add_step(row, events, wall)

    def _on_core_events(self, messages: list[Any]) -> None:
        """On the event loop: what a core in another process sent after a pass."""
        store = self.store
        for message in messages:
            if not isinstance(message, dict) or VIEW_MESSAGE not in message:
                continue  # another source's
            if message["info"] != store.info:
                store.info = dict(message["info"])
                store.series.kv_total = int(store.info["num_blocks"])
            origin = store.origin
            for row, events, wall in message["steps"]:
                shifted = [_shift(e, origin) for e in events]
                store.add_step(StepRow.from_list(row), shifted, wall)

    def _on_records(self, records: list[RequestRecord], steps: list[StepStat]) -> None:
        """The requests that finished in the last step (the engine thread, or the event loop
        for a core in another process)."""
        if records:
            self.store.add_records(records)

    def alive(self) -> bool:
        client = self.client
        return client.error is None and not getattr(client, "_stopping", False)


def install_dashboard(app: FastAPI, client: Any, *, title: str) -> LiveView | None:
    """Serve /dashboard for the engine behind `client` from `app` (behind the app's API key).

    `client` is an in-process AsyncEngine, or a CoreClient built with
    `event_source=view_source`; a client without a way to observe its engine's steps gets a
    page that says so."""
    if not isinstance(client, AsyncEngine) and getattr(client, "event_source", None) is None:
        store = ViewStore(
            mode="live",
            title=title,
            limits=Limits(),
            info={"note": "this engine core was started without the view's event source"},
        )
        app.include_router(make_router(lambda: store))
        return None
    view = LiveView(client, title=title)
    app.state.heddle_view = view
    app.include_router(make_router(lambda: view.store, alive=view.alive))
    return view
