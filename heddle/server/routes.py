"""The HTTP routes: the two generation endpoints, /v1/models, /health and /metrics."""

from __future__ import annotations

import time
from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from heddle.server.chat import create_chat_completion
from heddle.server.completions import create_completion
from heddle.server.errors import error_body
from heddle.server.sessions import close_session
from heddle.server.state import ServerState

router = APIRouter()
router.add_api_route("/v1/completions", create_completion, methods=["POST"])
router.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
router.add_api_route("/v1/sessions/{session_id}", close_session, methods=["DELETE"])

_STARTED = int(time.time())


@router.get("/v1/models")
async def list_models(raw: Request) -> JSONResponse:
    state: ServerState = raw.app.state.heddle
    model = {
        "id": state.model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "heddle",
        "max_model_len": state.max_model_len,
    }
    return JSONResponse({"object": "list", "data": [model]})


@router.get("/health")
async def health(raw: Request) -> JSONResponse:
    state: ServerState = raw.app.state.heddle
    engine = state.engine
    if engine.error is not None:
        body = error_body(f"the engine loop died: {engine.error!r}", "server_error")
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok", "engine": asdict(engine.stats)})


@router.get("/metrics")
async def metrics(raw: Request) -> Response:
    state: ServerState = raw.app.state.heddle
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
