"""A replay's compact columns answer as the live store's dicts do: the same events, requests,
drill-downs, markers, latency and request lists, from the same recorded run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from heddle.errors import HeddleError
from heddle.view.saved import FORMAT_V1, load_run, save_view
from heddle.view.store import Limits, ViewStore
from heddle.view.tables import EventTable, RequestTable
from tests.view.factories import SLO_TARGETS, recorded_run

BIG = Limits(step_rows=None, events=10**7, requests=10**7, recent_rows=0)  # dicts, no bound


@pytest.fixture(scope="module")
def stores() -> tuple[ViewStore, ViewStore]:
    """The same run in a replay store (compact) and in a store of dicts."""
    result, recorder = recorded_run(num_requests=60, num_blocks=40)
    compact = recorder.store
    compact.add_records(result.records)
    dicts = ViewStore(mode="replay", title="dicts", limits=BIG, slo=SLO_TARGETS)
    dicts.series = compact.series
    dicts.add_events(compact.events)
    dicts.add_request_rows(compact.requests.values())
    assert isinstance(compact.events, EventTable)
    assert isinstance(compact.requests, RequestTable)
    return compact, dicts


def test_compact_events_and_requests_read_back_as_the_dicts(stores) -> None:
    compact, dicts = stores
    assert list(compact.events) == list(dicts.events)
    kinds = {e["k"] for e in dicts.events}
    assert {"evict", "preempt", "stall", "recompute"} <= kinds  # every path of the table
    assert list(compact.requests.values()) == list(dicts.requests.values())
    same = ("num_steps", "num_requests", "num_events", "start", "end", "keys", "classes", "slo")
    assert {k: compact.meta()[k] for k in same} == {k: dicts.meta()[k] for k in same}


def test_drill_downs_markers_latency_and_lists_are_the_same(stores) -> None:
    compact, dicts = stores
    assert compact.latency() == dicts.latency()
    for sort in ("stall", "e2e", "ttft", "preemptions", "arrival"):
        assert compact.request_list(sort, 25) == dicts.request_list(sort, 25)
    ids = [r["id"] for r in dicts.requests.values()]
    for request_id in [*ids[::7], "no-such-request"]:
        assert compact.request(request_id) == dicts.request(request_id)
    end = compact.series.end_time
    for lo, hi, limit in ((None, None, 500), (0.0, end / 2, 500), (end / 3, end, 4)):
        assert compact.markers(lo, hi, limit) == dicts.markers(lo, hi, limit)


def test_the_line_format_loads_back_and_the_first_format_still_loads(stores, tmp_path) -> None:
    compact, _ = stores
    path = save_view(compact, tmp_path / "run.view.json.gz")
    again = load_run(path)
    assert list(again.events) == list(compact.events)
    assert list(again.requests.values()) == list(compact.requests.values())
    assert again.series.to_dict() == compact.series.to_dict()  # as saved: rounded alike
    old = tmp_path / "old.view.json.gz"
    with gzip.open(old, "wt") as f:  # what the first format wrote: one object
        json.dump(
            {
                "format": FORMAT_V1,
                "title": "old",
                "info": {},
                "slo": None,
                "steps": compact.series.to_dict(),
                "events": list(compact.events),
                "requests": list(compact.requests.values()),
                "pictures": {},
            },
            f,
        )
    first = load_run(old)
    assert list(first.events) == list(compact.events)
    assert first.latency()["classes"]["all"]["num"] == len(compact.requests)


def test_a_malformed_saved_view_is_a_clear_error(stores, tmp_path: Path) -> None:
    compact, _ = stores
    path = save_view(compact, tmp_path / "run.view.json.gz")
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    broken = tmp_path / "broken.view.json.gz"
    with gzip.open(broken, "wt") as f:
        f.write("\n".join([*lines[:3], '{"what": 1}']) + "\n")
    with pytest.raises(HeddleError, match="malformed"):
        load_run(broken)
    cut = tmp_path / "cut.view.json.gz"
    with gzip.open(cut, "wt") as f:
        f.write("\n".join(lines[:3]) + "\n")  # the steps' other columns are missing
    with pytest.raises(HeddleError, match="malformed"):
        load_run(cut)
    table = RequestTable()
    with pytest.raises(ValueError, match="fields the view does not know"):
        table["x"] = {"id": "x", "colour": "blue"}
