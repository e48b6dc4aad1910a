"""Records and step stats to and from JSONL: one object per line, every field, exact floats."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from heddle.metrics.record import RequestRecord
from heddle.metrics.steps import StepStat

_RECORD_FIELDS = frozenset(f.name for f in fields(RequestRecord))
_STEP_FIELDS = frozenset(f.name for f in fields(StepStat))


def record_to_dict(record: RequestRecord) -> dict[str, Any]:
    out = {f.name: getattr(record, f.name) for f in fields(RequestRecord)}
    out["token_times"] = list(record.token_times)
    return out


def record_from_dict(data: Mapping[str, Any]) -> RequestRecord:
    """Inverse of record_to_dict; keys this version does not know are ignored."""
    return RequestRecord(**{k: v for k, v in data.items() if k in _RECORD_FIELDS})


def records_to_jsonl(records: Iterable[RequestRecord], path: str | os.PathLike[str]) -> None:
    _write(path, (record_to_dict(r) for r in records))


def records_from_jsonl(path: str | os.PathLike[str]) -> list[RequestRecord]:
    return [record_from_dict(d) for d in _read(path)]


def steps_to_jsonl(steps: Iterable[StepStat], path: str | os.PathLike[str]) -> None:
    _write(path, (asdict(s) for s in steps))


def steps_from_jsonl(path: str | os.PathLike[str]) -> list[StepStat]:
    return [StepStat(**{k: v for k, v in d.items() if k in _STEP_FIELDS}) for d in _read(path)]


def _write(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    with Path(path).open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
