"""`heddle view RUN.json`: the dashboard of a saved simulation or bench run, on 127.0.0.1."""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.errors import HeddleError
from heddle.view.store import ViewStore

if TYPE_CHECKING:
    import fastapi


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run",
        help="a saved run: <label>.json (or <label>.view.json.gz) from `heddle simulate "
        "--output-dir`, or a bench run's JSON",
    )
    p.add_argument("--profile", default=None, help="a `heddle profile` JSON (step-time picture)")
    p.add_argument(
        "--sweep", default=None, help="a `heddle simulate --sweep` JSON (<label>_sweep.json)"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--no-open", action="store_true", help="print the URL, do not open a browser")


def load_store(run: str, profile: str | None = None, sweep: str | None = None) -> ViewStore:
    from heddle.view.pictures import check_picture
    from heddle.view.saved import load_run

    store = load_run(run)
    for path, expected in ((profile, "profile"), (sweep, "sweep")):
        if path is None:
            continue
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HeddleError(f"cannot read {path}: {e}") from None
        kind = check_picture(data)
        if kind != expected:
            raise HeddleError(f"{path} is a {kind} JSON, not a {expected} one")
        store.pictures[kind] = data
    return store


def build_view_app(store: ViewStore) -> fastapi.FastAPI:
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse

    from heddle.server.errors import install_error_handlers
    from heddle.view.routes import make_router

    app = FastAPI(title="heddle view", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(make_router(lambda: store))

    @app.get("/", include_in_schema=False, response_class=RedirectResponse)
    async def root():
        return RedirectResponse("/dashboard")

    return app


def run_view(args: argparse.Namespace) -> int:
    import uvicorn

    store = load_store(args.run, args.profile, args.sweep)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sock.close()
        raise HeddleError(f"cannot listen on {args.host}:{args.port}: {e}") from None
    port = sock.getsockname()[1]
    url = f"http://{args.host}:{port}/dashboard"
    meta = store.meta()
    print(
        f"heddle view: {store.title} — {meta['num_steps']} steps, {meta['num_requests']} "
        f"requests, {meta['num_events']} decision events\n{url}   (Ctrl-C to stop)",
        flush=True,
    )
    if not args.no_open:
        with contextlib.suppress(webbrowser.Error):
            webbrowser.open(url)
    config = uvicorn.Config(build_view_app(store), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    print("heddle view: stopped", file=sys.stderr)
    return 0
