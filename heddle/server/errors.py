"""OpenAI-style error bodies, and the handlers that turn every failure into one.

Every error a client can cause becomes `{"error": {"message", "type", "param", "code"}}` with a
4xx status; anything else becomes a 500 with the same shape. No traceback reaches a client.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from heddle.engine.async_engine import EngineDeadError
from heddle.errors import HeddleError, InvalidRequestError, QueueFullError

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        refused: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.refused = refused  # (request class, reason) of a request refused at arrival
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(
    message: str, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_engine_error(error: Exception) -> APIError:
    """The HTTP form of an error raised while adding a request to the engine."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, QueueFullError):
        # Retry-After is whole seconds (RFC 9110); admission control's estimate, rounded up.
        retry = 1 if error.retry_after is None else max(1, math.ceil(error.retry_after))
        return APIError(
            429,
            str(error),
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry)},
            refused=(error.request_class or "unknown", error.reason),
        )
    if isinstance(error, InvalidRequestError):
        code = "context_length_exceeded" if "context" in str(error) else None
        return APIError(400, str(error), param=error.param, code=code)
    if isinstance(error, EngineDeadError):
        return APIError(503, str(error), type="server_error", code="engine_unavailable")
    if isinstance(error, HeddleError):
        return APIError(400, str(error))
    logger.error("unexpected error", exc_info=error)
    return APIError(500, "internal server error", type="server_error")


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg')}", code="json_invalid")
    loc = _field_path(first)
    tag_at = next((i for i, part in enumerate(loc) if i and _is_type_tag(part)), None)
    if tag_at is not None:
        # A value matching none of a union's types gives one error per type: name the field.
        field = loc[:tag_at]
        param: str | None = ".".join(field)
        tags = [
            path[tag_at]
            for path in map(_field_path, errors)
            if path[:tag_at] == field and len(path) > tag_at
        ]
        message = f"{param}: wrong type or value; expected {' or '.join(dict.fromkeys(tags))}"
    else:
        param = ".".join(loc) or None
        message = str(first.get("msg", "invalid value"))
        if param:
            message = f"{param}: {message}"
    return APIError(400, message, param=param, code="invalid_value")


def _is_type_tag(part: str) -> bool:
    """pydantic labels each member of a union in an error's location: "str", "list[int]"..."""
    return part in ("str", "int", "float", "bool") or part.startswith(("list[", "dict["))


def _field_path(error: Any) -> list[str]:
    return [str(part) for part in error.get("loc", ()) if part != "body"]


def _respond(request: Request, error: APIError) -> JSONResponse:
    """The error response, counted in /metrics by status."""
    state = getattr(request.app.state, "heddle", None)
    if state is not None:
        state.metrics.http_errors.labels(str(error.status_code)).inc()
        if error.refused is not None:
            state.metrics.refused.labels(*error.refused).inc()
    return error.response()


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return _respond(request, exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _respond(request, _validation_error(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _respond(request, APIError(exc.status_code, str(exc.detail), code=code))

    async def heddle_error(request: Request, exc: Exception) -> JSONResponse:
        return _respond(request, from_engine_error(exc))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("unhandled error on %s", request.url.path, exc_info=exc)
        return _respond(request, APIError(500, "internal server error", type="server_error"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(HeddleError, heddle_error)
    app.add_exception_handler(Exception, unexpected)
