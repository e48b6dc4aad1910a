"""Record a run for the view: install the probe on an engine, keep every step and event."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.metrics.record import RequestRecord
from heddle.metrics.summary import SLO
from heddle.view.probe import StepProbe
from heddle.view.saved import save_view
from heddle.view.series import StepRow
from heddle.view.store import REPLAY, ViewStore

if TYPE_CHECKING:
    from heddle.engine.engine import Engine


class ViewRecorder:
    """`recorder.attach(engine)` before the run, `recorder.save(path, records)` after it."""

    def __init__(
        self, title: str, *, slo: SLO | None = None, info: dict[str, Any] | None = None
    ) -> None:
        self.store = ViewStore(mode="replay", title=title, limits=REPLAY, slo=slo, info=info)

    def attach(self, engine: Engine) -> None:
        self.store.origin = engine.clock.now()
        engine.step_observer = StepProbe(engine, self._sink)

    def _sink(self, row: StepRow, events: list[Any], wall: float) -> None:
        self.store.add_step(row, events, wall)

    def save(self, path: str | Path, records: Iterable[RequestRecord]) -> Path:
        self.store.add_records(records)
        return save_view(self.store, path)
