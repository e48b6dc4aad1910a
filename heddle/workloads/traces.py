"""Trace replay: the shared production CSV traces and heddle's own JSONL format.

JSONL: one object per line with arrival_time, prompt_len, output_len and optionally
request_id, request_class, user, priority, ttft_slo, tpot_slo, prompt_token_ids.
CSV: columns num_prefill_tokens, num_decode_tokens and optionally arrived_at (seconds); a trace
without arrivals takes them from an arrival process.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from heddle.errors import HeddleError
from heddle.workloads.arrivals import arrival_times
from heddle.workloads.request import WorkloadRequest
from heddle.workloads.synthetic import clip_len

TRACE_FILES = {
    "conv": "splitwise_conv.csv",
    "code": "splitwise_code.csv",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
}
TRACES_ENV = "HEDDLE_TRACES_DIR"


def trace_dir_candidates(traces_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where the shared traces are looked for, in order."""
    if traces_dir is not None:
        return [Path(traces_dir)]
    found = [Path(os.environ[TRACES_ENV])] if os.environ.get(TRACES_ENV) else []
    repo_root = Path(__file__).resolve().parents[2]
    found += [
        repo_root.parent / "shared" / "traces",
        Path.cwd().parent / "shared" / "traces",
        Path.cwd() / "shared" / "traces",
    ]
    return found


def trace_path(name: str, traces_dir: str | os.PathLike[str] | None = None) -> Path:
    """The file of a named trace ("conv", "code", "arxiv")."""
    if name not in TRACE_FILES:
        raise HeddleError(f"unknown trace {name!r}; known: {', '.join(TRACE_FILES)}")
    candidates = trace_dir_candidates(traces_dir)
    for directory in candidates:
        if (directory / TRACE_FILES[name]).is_file():
            return directory / TRACE_FILES[name]
    raise HeddleError(
        f"trace {name!r} ({TRACE_FILES[name]}) not found in "
        f"{', '.join(str(c) for c in candidates)}; set {TRACES_ENV} or pass traces_dir"
    )


def read_csv(path: str | os.PathLike[str], name: str = "trace") -> list[WorkloadRequest]:
    """A CSV trace as requests; arrivals are 0 when the trace has none."""
    path = Path(path)
    if not path.is_file():
        raise HeddleError(f"trace file {path} does not exist")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = set(reader.fieldnames or ())
        if not {"num_prefill_tokens", "num_decode_tokens"} <= columns:
            raise HeddleError(
                f"{path}: a CSV trace needs columns num_prefill_tokens and num_decode_tokens "
                f"(and optionally arrived_at); it has {sorted(columns)}"
            )
        timed = "arrived_at" in columns
        return [
            WorkloadRequest(
                f"{name}-{i}",
                float(row["arrived_at"]) if timed else 0.0,
                max(1, int(float(row["num_prefill_tokens"]))),
                max(1, int(float(row["num_decode_tokens"]))),
                prompt_seed=f"{name}:{i}",
            )
            for i, row in enumerate(reader)
        ]


def has_arrivals(path: str | os.PathLike[str]) -> bool:
    if str(path).endswith(".jsonl"):
        return True
    with Path(path).open(newline="") as f:
        return "arrived_at" in (csv.DictReader(f).fieldnames or ())


def load_jsonl(path: str | os.PathLike[str]) -> list[WorkloadRequest]:
    """Requests from a JSONL trace, sorted by arrival."""
    path = Path(path)
    if not path.is_file():
        raise HeddleError(f"trace file {path} does not exist")
    out = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise HeddleError(f"{path}:{lineno}: not JSON: {e}") from None
            if not isinstance(data, dict):
                raise HeddleError(f"{path}:{lineno}: expected a JSON object")
            out.append(WorkloadRequest.from_dict(data, default_id=f"{path.stem}-{lineno - 1}"))
    out.sort(key=lambda r: r.arrival_time)
    return out


def save_jsonl(requests: Iterable[WorkloadRequest], path: str | os.PathLike[str]) -> None:
    with Path(path).open("w") as f:
        for request in requests:
            f.write(json.dumps(request.to_dict()) + "\n")


def replay(
    requests: list[WorkloadRequest],
    *,
    seed: int = 0,
    num_requests: int | None = None,
    offset: int = 0,
    rate: float | None = None,
    arrival: str | None = None,
    cv: float = 1.0,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
    timed: bool = True,
    request_class: str | None = None,
) -> list[WorkloadRequest]:
    """Select, retime and rescale trace requests (already sorted by arrival).

    Rows offset..offset+num_requests are kept; arrivals are shifted to start at 0. With the
    trace's own arrivals (`timed` and no `arrival` process), `time_scale` multiplies the gaps
    (2.0 replays at half the rate) or `rate` rescales them to that mean rate; otherwise the
    arrival process (default poisson, rate default inf) supplies them. `length_scale`
    multiplies lengths (for replaying on a small model); lengths are then clipped.
    """
    if offset < 0 or (num_requests is not None and num_requests < 0):
        raise HeddleError("offset and num_requests must be >= 0")
    if time_scale <= 0 or length_scale <= 0:
        raise HeddleError("time_scale and length_scale must be positive")
    if rate is not None and time_scale != 1.0 and timed and arrival is None:
        raise HeddleError("give either rate or time_scale for a timed trace, not both")
    end = None if num_requests is None else offset + num_requests
    chosen = requests[offset:end]
    if timed and arrival is None:
        start = chosen[0].arrival_time if chosen else 0.0
        times = [(r.arrival_time - start) * time_scale for r in chosen]
        span = times[-1] if times else 0.0
        if rate is not None and span > 0:
            factor = (len(times) - 1) / (rate * span)
            times = [t * factor for t in times]
    else:
        rng = random.Random(f"{seed}:trace:arrivals")
        times = arrival_times(
            arrival or "poisson", math.inf if rate is None else rate, len(chosen), rng, cv
        )
    out = []
    for r, t in zip(chosen, times, strict=True):
        out.append(_rescale(r, t, length_scale, max_prompt_len, max_output_len, request_class))
    return out


def _rescale(
    r: WorkloadRequest,
    arrival_time: float,
    length_scale: float,
    max_prompt_len: int | None,
    max_output_len: int | None,
    request_class: str | None,
) -> WorkloadRequest:
    hi_p, hi_o = max_prompt_len or 1 << 30, max_output_len or 1 << 30
    output_len = clip_len(r.output_len * length_scale, 1, hi_o)
    cls = request_class or r.request_class
    if r.prompt_token_ids is not None:
        if length_scale != 1.0:
            raise HeddleError(
                f"request {r.request_id} has explicit prompt_token_ids: "
                "length_scale cannot rescale them"
            )
        ids = r.prompt_token_ids[:hi_p]
        return replace(
            r,
            arrival_time=arrival_time,
            prompt_len=len(ids),
            prompt_token_ids=ids,
            output_len=output_len,
            request_class=cls,
        )
    prompt_len = clip_len(r.prompt_len * length_scale, 1, hi_p)
    return replace(
        r,
        arrival_time=arrival_time,
        prompt_len=prompt_len,
        output_len=output_len,
        request_class=cls,
    )


def trace(
    source: str,
    seed: int = 0,
    num_requests: int | None = None,
    rate: float | None = None,
    arrival: str | None = None,
    cv: float = 1.0,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
    offset: int = 0,
    request_class: str | None = None,
    traces_dir: str | None = None,
) -> list[WorkloadRequest]:
    """Replay a named shared trace ("conv", "code", "arxiv") or a .csv/.jsonl file.

    Requests of a named trace get request_class = the trace name unless `request_class` is given.
    """
    if source in TRACE_FILES:
        path = trace_path(source, traces_dir)
        base = read_csv(path, source)
        request_class = request_class or source
    else:
        path = Path(source)
        if path.suffix not in (".csv", ".jsonl"):
            raise HeddleError(f"a trace file must end in .csv or .jsonl, got {source!r}")
        if not path.is_file():
            raise HeddleError(f"trace file {source} does not exist")
        base = load_jsonl(path) if path.suffix == ".jsonl" else read_csv(path, path.stem)
    if path.suffix == ".csv":
        base.sort(key=lambda r: r.arrival_time)  # stable: untimed traces keep file order
    return replay(
        base,
        seed=seed,
        num_requests=num_requests,
        offset=offset,
        rate=rate,
        arrival=arrival,
        cv=cv,
        time_scale=time_scale,
        length_scale=length_scale,
        max_prompt_len=max_prompt_len,
        max_output_len=max_output_len,
        timed=has_arrivals(path),
        request_class=request_class,
    )
