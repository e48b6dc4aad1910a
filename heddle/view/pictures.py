"""The learner's two pictures, each with one sentence saying what it shows.

1. Step time against batch size: from a `heddle profile` fit (decode steps of b sequences at a
   fixed context), with the steps this run actually took drawn over it.
2. The latency/throughput knee: from `heddle simulate --sweep` (one point per offered load).
"""

from __future__ import annotations

import math
from typing import Any

from heddle.errors import HeddleError
from heddle.view.store import ViewStore

PROFILE_FORMAT = "heddle-step-profile/1"
PROFILE_CONTEXT = 512  # context length of the decode steps the profile curve shows
BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def check_picture(data: Any) -> str:
    """Which picture a loaded JSON feeds: "profile" or "sweep". Raises HeddleError."""
    if isinstance(data, dict) and data.get("format") == PROFILE_FORMAT:
        if not isinstance(data.get("coefficients"), dict):
            raise HeddleError("the step profile has no coefficients")
        return "profile"
    points = data.get("points") if isinstance(data, dict) else data
    if (
        isinstance(points, list)
        and points
        and all(
            isinstance(p, dict) and "offered_load" in p and "request_throughput" in p
            for p in points
        )
    ):
        return "sweep"
    raise HeddleError(
        "not a step profile (`heddle profile --output P.json`) nor a sweep "
        "(`heddle simulate --sweep ... --output-dir D` writes D/<label>_sweep.json)"
    )


def pictures(store: ViewStore) -> dict[str, Any]:
    loaded = store.pictures
    with_steps = store.series.num_steps > 0
    observed = store.series.scatter() if with_steps else {"batch": [], "dur": [], "prefill": []}
    return {
        "step_time": _step_time(loaded.get("profile"), observed),
        "knee": _knee(loaded.get("sweep")),
    }


def _profile_time(coefficients: dict[str, float], batch: int, context: int) -> float:
    """A decode step of `batch` sequences at `context` tokens each (heddle.sim.profiled)."""
    c = coefficients.get
    return (
        c("constant", 0.0)
        + batch * (c("decode_tokens", 0.0) + c("sampled_rows", 0.0))
        + batch * context * c("decode_context_tokens", 0.0)
    )


def _step_time(profile: dict[str, Any] | None, observed: dict[str, list[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"observed": observed, "curve": None, "sentence": None}
    columns = zip(observed["batch"], observed["dur"], observed["prefill"], strict=True)
    decode_only = [(b, d) for b, d, p in columns if not p]
    if profile is not None:
        coefficients = profile["coefficients"]
        times = [_profile_time(coefficients, b, PROFILE_CONTEXT) for b in BATCH_SIZES]
        out["curve"] = {
            "batch": list(BATCH_SIZES),
            "step": [round(t, 7) for t in times],
            "per_token": [round(t / b, 7) for t, b in zip(times, BATCH_SIZES, strict=True)],
            "context": PROFILE_CONTEXT,
            "machine": (profile.get("metadata") or {}).get("machine"),
        }
        one, eight = times[0], times[BATCH_SIZES.index(8)]
        doubled = next((b for b, t in zip(BATCH_SIZES, times, strict=True) if t >= 2 * one), None)
        where = (
            f"it takes twice a single sequence's time only at a batch of {doubled}"
            if doubled
            else f"even {BATCH_SIZES[-1]} sequences take less than twice one's time"
        )
        out["sentence"] = (
            f"On this machine a decode step of 8 sequences takes {_ms(eight)} against "
            f"{_ms(one)} for one ({eight / one:.1f}x the time for 8x the tokens); {where}, "
            "so batching is almost free until then and latency grows with the batch after it."
        )
    elif decode_only:
        by_batch: dict[int, list[float]] = {}
        for b, d in decode_only:
            by_batch.setdefault(b, []).append(d)
        smallest, largest = min(by_batch), max(by_batch)
        if largest > smallest:
            t_small = sorted(by_batch[smallest])[len(by_batch[smallest]) // 2]
            t_large = sorted(by_batch[largest])[len(by_batch[largest]) // 2]
            out["sentence"] = (
                f"In this run a decode step of {largest} sequences took {_ms(t_large)} against "
                f"{_ms(t_small)} for {smallest}: {largest / smallest:.0f}x the tokens for "
                f"{t_large / t_small:.1f}x the time (load a `heddle profile` JSON for the curve)."
            )
    return out


def _knee(sweep: Any) -> dict[str, Any] | None:
    if sweep is None:
        return None
    listed = sweep.get("points") if isinstance(sweep, dict) else sweep
    points = sorted(listed or [], key=lambda p: p["offered_load"])
    latency_key = "ttft_p99" if any(_num(p.get("ttft_p99")) for p in points) else "e2e_p99"
    lat = [_num(p.get(latency_key)) or 0.0 for p in points]
    floor = min((v for v in lat if v > 0), default=0.0)
    knee = None
    for p, v in zip(points, lat, strict=True):
        keeps_up = (_num(p["request_throughput"]) or 0.0) >= 0.9 * p["offered_load"]
        if keeps_up and (floor == 0 or v <= 3 * floor):
            knee = p
    out: dict[str, Any] = {
        "offered": [p["offered_load"] for p in points],
        "throughput": [_num(p["request_throughput"]) for p in points],
        "output_throughput": [_num(p.get("output_throughput")) for p in points],
        "latency": lat,
        "latency_key": latency_key,
        "series": points[0].get("series") if points else None,
        "knee": None if knee is None else knee["offered_load"],
        "sentence": None,
    }
    if knee is not None and points:
        last = points[-1]
        name = "p99 TTFT" if latency_key == "ttft_p99" else "p99 E2E"
        knee_lat = lat[points.index(knee)]
        out["sentence"] = (
            f"Up to about {knee['offered_load']:.3g} req/s the engine keeps up (throughput "
            f"follows the offered load, {name} {_s(knee_lat)}); past that knee extra load only "
            f"queues: at {last['offered_load']:.3g} req/s it serves "
            f"{last['request_throughput']:.3g} req/s and {name} is {_s(lat[-1])}."
        )
    return out


def _num(value: Any) -> float | None:
    """A number from a saved JSON (which writes inf and nan as strings), or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
