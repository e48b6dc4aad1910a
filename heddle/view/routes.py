"""The dashboard's HTTP routes, the same for a live server and for `heddle view`.

GET /dashboard                    the page (static HTML; its scripts are vendored, offline)
GET /dashboard/static/{name}      uPlot and the page's own script and style
GET /dashboard/api/meta           mode, title, step and request counts, classes, SLO
GET /dashboard/api/steps          ?start=&end=&max= : buckets of steps (see StepSeries.window)
GET /dashboard/api/latency        CDFs per class, goodput against the SLO
GET /dashboard/api/requests       ?sort=stall|e2e|ttft|preemptions|arrival&limit=
GET /dashboard/api/request/{id}   the drill-down: timeline, reasons, "why did it wait?"
GET /dashboard/api/markers        ?start=&end= : preemptions and evictions
GET /dashboard/api/pictures       the step-time and knee pictures' data
POST /dashboard/api/pictures      add a profile or sweep JSON to them
GET /dashboard/api/stream         Server-Sent Events: new steps and events, 4 per second
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

from heddle.errors import HeddleError
from heddle.server.errors import error_body
from heddle.view.pictures import check_picture, pictures
from heddle.view.store import ViewStore

STREAM_INTERVAL_S = 0.25  # a message (and at most one redraw of the page) per 0.25 s: VIEW.md
STREAM_LIFETIME_S = 10.0
STATIC_FILES = {
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "LICENSE-uPlot.txt": "text/plain",
}


def static_dir() -> Any:
    return resources.files("heddle.view") / "static"


def _json(data: Any) -> Response:
    return Response(
        json.dumps(data, separators=(",", ":"), allow_nan=False, default=_finite),
        media_type="application/json",
    )


def _finite(value: Any) -> Any:
    raise TypeError(f"not JSON: {value!r}")


def _not_found(message: str) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", None, "not_found"), 404)


def _bad(message: str, param: str) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", param, None), 400)


def make_router(
    get_store: Callable[[], ViewStore], *, alive: Callable[[], bool] | None = None
) -> APIRouter:
    """Routes over the store `get_store()` returns; open streams end once `alive()` is false
    (the engine stopped)."""
    router = APIRouter()

    @router.get("/dashboard", include_in_schema=False)
    async def page() -> Response:
        return FileResponse(str(static_dir() / "dashboard.html"), media_type="text/html")

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        media_type = STATIC_FILES.get(name)
        if media_type is None:
            return _not_found(f"no static file {name!r}")
        return FileResponse(str(static_dir() / name), media_type=media_type)

    @router.get("/dashboard/api/meta")
    async def meta() -> Response:
        return _json(get_store().meta())

    @router.get("/dashboard/api/steps")
    async def steps(
        start: float | None = None, end: float | None = None, max: int = Query(1500)
    ) -> Response:
        if not 1 <= max <= 20_000:
            return _bad("max must be between 1 and 20000", "max")
        if any(v is not None and not math.isfinite(v) for v in (start, end)):
            return _bad("start and end must be finite numbers", "start")
        return _json(get_store().steps(start, end, max))

    @router.get("/dashboard/api/latency")
    async def latency() -> Response:
        return _json(await asyncio.to_thread(get_store().latency))

    @router.get("/dashboard/api/requests")
    async def requests(sort: str = "stall", limit: int = 50) -> Response:
        if not 1 <= limit <= 1000:
            return _bad("limit must be between 1 and 1000", "limit")
        try:
            return _json(get_store().request_list(sort, limit))
        except ValueError as e:
            return _bad(str(e), "sort")

    @router.get("/dashboard/api/request/{request_id}")
    async def request(request_id: str) -> Response:
        detail = await asyncio.to_thread(get_store().request, request_id)
        if detail is None:
            return _not_found(f"no request {request_id!r} in this view (finished ones are kept)")
        return _json(detail)

    @router.get("/dashboard/api/markers")
    async def markers(start: float | None = None, end: float | None = None) -> Response:
        return _json(get_store().markers(start, end))

    @router.get("/dashboard/api/pictures")
    async def picture_data() -> Response:
        return _json(await asyncio.to_thread(pictures, get_store()))

    @router.post("/dashboard/api/pictures")
    async def add_picture(raw: Request) -> Response:
        try:
            data = await raw.json()
            kind = check_picture(data)
        except (ValueError, UnicodeDecodeError):
            return _bad("the body is not JSON", "body")
        except HeddleError as e:
            return _bad(str(e), "body")
        get_store().pictures[kind] = data
        return _json(await asyncio.to_thread(pictures, get_store()))

    @router.get("/dashboard/api/stream")
    async def stream(raw: Request, steps: int = 0, events: int = 0) -> Response:
        # A reconnecting EventSource sends the id of the last message it got: resume there.
        resume = raw.headers.get("last-event-id", "")
        seen_steps, _, seen_events = resume.partition(":")
        if seen_steps.isdigit() and seen_events.isdigit():
            steps, events = int(seen_steps), int(seen_events)
        return StreamingResponse(
            _events(get_store, steps, events, alive),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    return router


async def _events(
    get_store: Callable[[], ViewStore],
    seen_steps: int,
    seen_events: int,
    alive: Callable[[], bool] | None,
) -> AsyncIterator[str]:
    """Every STREAM_INTERVAL_S, what is new since the last message (nothing: a heartbeat
    comment every few seconds). A stream lasts STREAM_LIFETIME_S, then the browser reconnects
    and resumes from the last message's id: an open dashboard never holds a server's shutdown
    for longer than that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STREAM_LIFETIME_S
    quiet = 0
    # The browser reconnects 0.1 s after a stream ends; the stream ends right after a message
    # (not a period later), so the steps of a reconnect wait about one period as any others.
    yield "retry: 100\n\n"
    tick = loop.time()
    while alive is None or alive():
        update = get_store().stream_since(seen_steps, seen_events)
        if update["rows"] or update["events"] or update["num_steps"] != seen_steps:
            seen_steps, seen_events = update["num_steps"], update["num_events"]
            body = json.dumps(update, separators=(",", ":"))
            yield f"id: {seen_steps}:{seen_events}\ndata: {body}\n\n"
            quiet = 0
        else:
            quiet += 1
            if quiet * STREAM_INTERVAL_S >= 5:
                yield ": idle\n\n"
                quiet = 0
        if loop.time() >= deadline:
            break
        # A fixed cadence: the time to build and send a message is not added to the period.
        tick += STREAM_INTERVAL_S
        await asyncio.sleep(max(0.0, tick - loop.time()))
