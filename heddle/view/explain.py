"""A request's drill-down: its timeline, and "why did my request wait?" in a sentence or two.

Built from the request's row (arrival, first scheduled, first token, finish) and the decision
events that name it: its stall intervals (each split by reason), the preemptions it suffered or
caused, and the evictions its allocations made.
"""

from __future__ import annotations

from typing import Any

REASON_TEXT = {
    "token_budget": "the step's token budget was spent by requests ahead of it",
    "no_seat": "every seat in the batch was taken (max_num_seqs)",
    "lane_cap": "its lane's share of the step was spent",
    "admission_held": "the policy held its admission back",
    "out_of_blocks": "there were not enough free KV blocks",
    "parent_not_ready": "it waited for its n>1 parent's prompt",
    "preempted": "it was preempted and lost its KV blocks",
    "step_preempted": "the step had to preempt someone, so it admitted no one",
}


def explain_request(row: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The drill-down of one request: `segments` for its timeline, `reasons` (seconds each),
    `preemptions`, `evictions`, and `text`: the answer to "why did my request wait?"."""
    request_id = row["id"]
    stalls = sorted((e for e in events if e["k"] == "stall"), key=lambda e: e["t0"])
    suffered = [e for e in events if e["k"] == "preempt" and e["victim"] == request_id]
    caused = [e for e in events if e["k"] == "preempt" and e["for"] == request_id]
    evictions = [e for e in events if e["k"] == "evict" and request_id in e["for"]]
    recomputes = sorted(
        (e for e in events if e["k"] == "recompute" and e["id"] == request_id),
        key=lambda e: e["t0"],
    )
    reasons: dict[str, float] = {}
    for stall in stalls:
        for reason, seconds in stall["sec"].items():
            reasons[reason] = reasons.get(reason, 0.0) + seconds
    segments = _segments(row, stalls, suffered, recomputes)
    return {
        "request": row,
        "segments": segments,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        "stalls": stalls,
        "preemptions": suffered,
        "caused_preemptions": caused,
        "evictions": evictions,
        "recomputes": recomputes,
        "text": _text(row, reasons, suffered, caused, evictions, recomputes),
    }


def _segments(
    row: dict[str, Any],
    stalls: list[dict[str, Any]],
    preemptions: list[dict[str, Any]],
    recomputes: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """[start, end, kind, reason] pieces: queued / stalled / preempted (waits, from the stall
    events), prefill / recompute / decode (running: recompute from the step a preempted
    request is back to the one it has its KV again, from its recompute event; prefill before
    the first token, decode after)."""
    arrival, finish = row["arrival"], row.get("finish")
    first_token = row.get("first_token")
    scheduled = row.get("scheduled")
    preempt_times = [p["t"] for p in preemptions]
    waits = [
        {
            "start": s["t0"],
            "end": s["t1"],
            "kind": _wait_kind(s, preempt_times),
            "reason": max(s["sec"], key=s["sec"].__getitem__) if s["sec"] else None,
            "seconds": s["sec"],
        }
        for s in stalls
    ]
    if not waits and scheduled is not None and scheduled > arrival:
        # No events: the record still says how long it queued before its first step.
        waits.append(
            {"start": arrival, "end": scheduled, "kind": "queued", "reason": None, "seconds": {}}
        )
    end = finish if finish is not None else max([arrival, *(w["end"] for w in waits)])
    out: list[dict[str, Any]] = []
    cursor = arrival
    after_preemption = False
    for wait in waits:
        if wait["start"] > cursor:
            out.extend(_running(cursor, wait["start"], first_token, after_preemption, recomputes))
            after_preemption = False  # the stretch after a preemption began with its recompute
        after_preemption = after_preemption or wait["kind"] == "preempted"
        out.append(wait)
        cursor = max(cursor, wait["end"])
    if end > cursor:
        out.extend(_running(cursor, end, first_token, after_preemption, recomputes))
    return out


def _wait_kind(stall: dict[str, Any], preempt_times: list[float]) -> str:
    if "preempted" in stall["sec"] or any(abs(t - stall["t0"]) < 1e-9 for t in preempt_times):
        return "preempted"
    return "queued" if stall["q"] == "waiting" else "stalled"


def _piece(a: float, b: float, kind: str, note: str | None = None) -> dict[str, Any]:
    return {"start": a, "end": b, "kind": kind, "reason": note, "seconds": {}}


def _running(
    start: float,
    end: float,
    first_token: float | None,
    after_preemption: bool,
    recomputes: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """A stretch in the batch: recompute first after a preemption, then prefill up to the
    first token and decode after it."""
    if after_preemption:
        recompute = next((r for r in recomputes if abs(r["t0"] - start) < 1e-6), None)
        if recompute is not None:
            done = end if recompute["t1"] is None else min(max(recompute["t1"], start), end)
            note = f"{max(0, recompute['tokens'] - recompute['cached'])} tokens"
            pieces = [_piece(start, done, "recompute", note)] if done > start else []
            if end > done:
                pieces.extend(_running(done, end, first_token, False, recomputes))
            return pieces
    before = "recompute" if after_preemption else "prefill"
    if first_token is None or first_token >= end:
        return [_piece(start, end, before)]
    if first_token <= start:
        # Past its first token: a resumed request with no recompute event (it left the ring)
        # recomputes, then decodes on; where one ends and the other starts is not known.
        return [_piece(start, end, "decode", "recomputed first" if after_preemption else None)]
    return [_piece(start, first_token, before), _piece(first_token, end, "decode")]


def _text(
    row: dict[str, Any],
    reasons: dict[str, float],
    suffered: list[dict[str, Any]],
    caused: list[dict[str, Any]],
    evictions: list[dict[str, Any]],
    recomputes: list[dict[str, Any]],
) -> str:
    parts: list[str] = []
    stall = row.get("stall") or 0.0
    explained = sum(reasons.values())
    if stall <= 0 and not reasons:
        parts.append("It never waited: it was in every step from arrival to finish.")
    else:
        parts.append(f"It waited {_seconds(stall or explained)} while ready to run")
        if reasons:
            ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
            pieces = [f"{_seconds(s)} because {REASON_TEXT.get(r, r)}" for r, s in ranked]
            parts[-1] += ": " + "; ".join(pieces) + "."
        else:
            parts[-1] += (
                " (no decision event names it: they were off, or have left the ring buffer)."
            )
    for p in suffered:
        whom = f"to make room for {p['for']}" if p["for"] else "because it could not grow"
        parts.append(f"At {p['t']:.3f} s it was preempted {whom} ({p['reason']}).")
        back = next((r for r in recomputes if r["preempted_step"] == p["step"]), None)
        if back is not None:
            parts.append(_recompute_text(back))
    missing = (row.get("preemptions") or 0) - len(suffered)
    if missing > 0:
        parts.append(f"It was preempted {missing} time(s) and recomputed its KV each time.")
    if caused:
        victims = ", ".join(p["victim"] for p in caused[:5])
        parts.append(f"It preempted {victims} to get room.")
    if evictions:
        parts.append(
            f"In {len(evictions)} of its steps, its allocations took blocks that held cached "
            "KV (evicting that cache)."
        )
    cached = row.get("cached") or 0
    if cached:
        parts.append(f"{cached} prompt tokens came from the prefix cache.")
    return " ".join(parts)


def _recompute_text(r: dict[str, Any]) -> str:
    """One preemption's cost: what it recomputed, and the evictions that made it."""
    redo = max(0, r["tokens"] - r["cached"])
    took = f" in {_seconds(r['t1'] - r['t0'])}" if r["t1"] is not None else ""
    text = f"Back at {r['t0']:.3f} s, it recomputed {redo} of its {r['tokens']} tokens{took}"
    if r["cached"]:
        text += f" ({r['cached']} came back from the prefix cache)"
    if r["evicted_blocks"]:
        whom = ", ".join(r["evicted_for"][:5]) or "other requests"
        steps = ", ".join(str(s) for s in r["evicted_steps"][:5])
        text += (
            f"; {r['evicted_blocks']} of its {r['cached_blocks']} cached blocks had been evicted "
            f"while it waited (step {steps}, for {whom}): those evictions made it recompute them"
        )
    elif r["cached_blocks"] and redo:
        text += f"; its {r['cached_blocks']} cached blocks were all still there"
    return text + "."


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
