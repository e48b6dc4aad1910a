"""Saved runs for the view: write what a simulation recorded, read it (or a bench run) back.

`heddle simulate --output-dir D` writes `D/<label>.view.json.gz` beside `D/<label>.json`:

    {"format": "heddle-view/1", "title", "info", "slo",
     "steps": StepSeries.to_dict() (columnar, one entry per step),
     "events": [decision events as the page reads them],
     "requests": [one compact row per finished request (no per-token list)],
     "pictures": {"profile": ..., "sweep": ...}}

gzip-compressed JSON: a 100k-request run is tens of MB instead of the hundreds its per-token
records take. `load_run(path)` also accepts a run's own JSON (`<label>.json` of simulate, or a
bench run): it uses the `.view.json.gz` beside it when there is one, and otherwise shows the
requests the JSON records (a bench run has no steps: it measured from the client).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from heddle.errors import HeddleError
from heddle.metrics.jsonl import record_from_dict
from heddle.metrics.summary import SLO
from heddle.view.series import StepSeries
from heddle.view.store import REPLAY, ViewStore

FORMAT = "heddle-view/1"
SUFFIX = ".view.json.gz"


def view_path_for(run_json: str | Path) -> Path:
    path = Path(run_json)
    return path.with_name(path.name.removesuffix(".json") + SUFFIX)


def save_view(store: ViewStore, path: str | Path) -> Path:
    data = {
        "format": FORMAT,
        "title": store.title,
        "info": store.info,
        "slo": None if store.slo is None else {"ttft": store.slo.ttft, "tpot": store.slo.tpot},
        "steps": store.series.to_dict(),
        "events": list(store.events),
        "requests": list(store.requests.values()),
        "pictures": store.pictures,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", compresslevel=5) as f:
        json.dump(data, f, separators=(",", ":"), allow_nan=False)
    return out


def load_run(path: str | Path) -> ViewStore:
    """A saved view, a simulate run's JSON, or a bench run's JSON, as a replay store."""
    source = Path(path)
    if not source.is_file():
        raise HeddleError(f"no run file at {source}")
    if source.name.endswith(".json"):
        beside = view_path_for(source)
        if beside.is_file():
            source = beside
    data = _read(source)
    if data.get("format") == FORMAT:
        return _from_view(data, source)
    if isinstance(data.get("records"), list):
        return _from_records(data, source)
    raise HeddleError(
        f"{source} is neither a saved view ({FORMAT}) nor a run with records "
        "(from `heddle simulate --output-dir` or `heddle bench serve --output-dir`)"
    )


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
    store.add_events(data.get("events") or [])
    store.add_request_rows(data.get("requests") or [])
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
