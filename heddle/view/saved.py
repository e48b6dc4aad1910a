"""Saved runs for the view: write what a simulation recorded, read it (or a bench run) back.

`heddle simulate --output-dir D` writes `D/<label>.view.json.gz` beside `D/<label>.json`:
gzip-compressed JSON lines, each read on its own, so that loading never holds more than one
line's objects besides the store's compact columns:

    {"format": "heddle-view/2", "title", "info", "slo", "pictures", "num_steps", "kv_total"}
    {"column": name, "group": null or group, "values": [...]}     one line per step column
    {"events": [decision events as the page reads them]}         10,000 a line
    {"requests": [one compact row per finished request]}         10,000 a line (no token list)

A 100k-request run is tens of MB instead of the hundreds its per-token records take. Files of
the first format (heddle-view/1: one JSON object with "steps", "events", "requests") are still
read (whole, so with the memory their objects take while loading). `load_run(path)` also
accepts a run's own JSON (`<label>.json` of simulate, or a bench run): it uses the
`.view.json.gz` beside it when there is one, and otherwise shows the requests the JSON records
(a bench run has no steps: it measured from the client).
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from heddle.errors import HeddleError
from heddle.metrics.jsonl import record_from_dict
from heddle.metrics.summary import SLO
from heddle.view.series import StepSeries
from heddle.view.store import REPLAY, ViewStore

FORMAT = "heddle-view/2"
FORMAT_V1 = "heddle-view/1"
SUFFIX = ".view.json.gz"
CHUNK = 10_000  # events or requests per line


def view_path_for(run_json: str | Path) -> Path:
    path = Path(run_json)
    return path.with_name(path.name.removesuffix(".json") + SUFFIX)


def save_view(store: ViewStore, path: str | Path) -> Path:
    header = {
        "format": FORMAT,
        "title": store.title,
        "info": store.info,
        "slo": None if store.slo is None else {"ttft": store.slo.ttft, "tpot": store.slo.tpot},
        "pictures": store.pictures,
        "num_steps": store.series.num_steps,
        "kv_total": store.series.kv_total,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", compresslevel=5) as f:
        _line(f, header)
        for group, name, values in store.series.saved_columns():
            _line(f, {"column": name, "group": group, "values": values})
        for chunk in _chunks(store.events):
            _line(f, {"events": chunk})
        for chunk in _chunks(store.requests.values()):
            _line(f, {"requests": chunk})
    return out


def _line(f: IO[str], item: Any) -> None:
    json.dump(item, f, separators=(",", ":"), allow_nan=False)
    f.write("\n")


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, CHUNK)):
        yield chunk


def load_run(path: str | Path) -> ViewStore:
    """A saved view, a simulate run's JSON, or a bench run's JSON, as a replay store."""
    source = Path(path)
    if not source.is_file():
        raise HeddleError(f"no run file at {source}")
    if source.name.endswith(".json"):
        beside = view_path_for(source)
        if beside.is_file():
            source = beside
    if _is_v2(source):
        return _from_lines(source)
    data = _read(source)
    if data.get("format") == FORMAT_V1:
        return _from_view(data, source)
    if isinstance(data.get("records"), list):
        return _from_records(data, source)
    raise HeddleError(
        f"{source} is neither a saved view ({FORMAT}) nor a run with records "
        "(from `heddle simulate --output-dir` or `heddle bench serve --output-dir`)"
    )


def _is_v2(path: Path) -> bool:
    """Whether `path` starts as a saved view of the line format does (read no further)."""
    if not path.name.endswith(".gz"):
        return False
    try:
        with gzip.open(path, "rt") as f:
            start = f.read(64)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise HeddleError(f"cannot read {path}: {e}") from None
    return start.startswith('{"format":"' + FORMAT + '"')


def _from_lines(source: Path) -> ViewStore:
    """A saved view of the line format, one line at a time into the store's columns."""
    try:
        with gzip.open(source, "rt") as f:
            header = json.loads(f.readline())
            store = ViewStore(
                mode="replay",
                title=str(header.get("title") or source.name),
                limits=REPLAY,
                slo=_slo(header.get("slo")),
                info={**(header.get("info") or {}), "source": str(source)},
            )
            store.pictures = dict(header.get("pictures") or {})
            series = store.series
            for number, line in enumerate(f, start=2):
                item = json.loads(line)
                if "column" in item:
                    series.load_column(item.get("group"), item["column"], item["values"])
                elif "events" in item:
                    store.add_events(item["events"])
                elif "requests" in item:
                    store.add_request_rows(item["requests"])
                else:
                    raise ValueError(f"line {number} is none of a column, events, requests")
            series.finish_loading(header.get("num_steps"), header.get("kv_total", 0))
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HeddleError(f"cannot read {source}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise HeddleError(f"{source}: the saved view is malformed ({e})") from None
    return store


def _read(path: Path) -> dict[str, Any]:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt") as f:
                data = json.load(f)
        else:
            data = json.loads(path.read_text())
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HeddleError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise HeddleError(f"{path} does not hold a JSON object")
    return data


def _slo(data: Any) -> SLO | None:
    if not isinstance(data, dict):
        return None
    return SLO(ttft=data.get("ttft"), tpot=data.get("tpot"))


def _from_view(data: dict[str, Any], source: Path) -> ViewStore:
    store = ViewStore(
        mode="replay",
        title=str(data.get("title") or source.name),
        limits=REPLAY,
        slo=_slo(data.get("slo")),
        info={**(data.get("info") or {}), "source": str(source)},
    )
    try:
        store.series = StepSeries.from_dict(data["steps"])
    except (KeyError, TypeError, ValueError) as e:
        raise HeddleError(f"{source}: the saved steps are malformed ({e})") from None
    try:
        store.add_events(data.get("events") or [])
        store.add_request_rows(data.get("requests") or [])
    except (KeyError, TypeError, ValueError) as e:
        raise HeddleError(f"{source}: the saved view is malformed ({e})") from None
    store.pictures = dict(data.get("pictures") or {})
    return store


def _from_records(data: dict[str, Any], source: Path) -> ViewStore:
    config = data.get("config") or {}
    summary_slo = (data.get("summary") or {}).get("slo")
    kind = "bench" if "base_url" in config else "run"
    store = ViewStore(
        mode="replay",
        title=f"{kind}: {source.name}",
        limits=REPLAY,
        slo=_slo(summary_slo),
        info={
            "source": str(source),
            "note": "no step data: "
            + (
                "a bench run measures from the client"
                if kind == "bench"
                else "this run was saved without its view file"
            ),
            "config": {k: v for k, v in config.items() if isinstance(v, (str, int, float))},
        },
    )
    try:
        records = [record_from_dict(r) for r in data["records"]]
    except TypeError as e:
        raise HeddleError(f"{source}: malformed records ({e})") from None
    origin = min((r.arrival_time for r in records), default=0.0)
    store.origin = origin
    store.add_records(records)
    return store
