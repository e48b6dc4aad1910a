"""ASGI middleware: a bound on body size and bearer-token authentication.

Both answer before the app runs, with OpenAI-style error bodies. The body limit reads the body
itself (up to the limit) and replays it to the app, so a chunked upload cannot slip past it.
"""

from __future__ import annotations

import json
import secrets
from urllib.parse import parse_qs, quote, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heddle.server.errors import error_body

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


async def _send_error(
    send: Send,
    status: int,
    message: str,
    type: str,
    code: str | None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps(error_body(message, type, None, code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """413 for a request body over `max_bytes`, whether announced by Content-Length or not."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await _send_error(
            send,
            413,
            f"the request body is larger than {self.max_bytes} bytes",
            "invalid_request_error",
            "request_too_large",
        )


class APIKeyMiddleware:
    """401 unless `Authorization: Bearer <api_key>`, for paths under `protected_prefix`.

    The dashboard (`browser_prefix`) is opened by a browser, which cannot send that header on
    a page load or an EventSource: there the key may also come as `?api_key=KEY` (the page is
    then answered with a redirect that moves the key into an HttpOnly cookie) or that cookie.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        protected_prefix: str = "/v1",
        browser_prefix: str | None = "/dashboard",
    ) -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.protected_prefix = protected_prefix
        self.browser_prefix = browser_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        prefix = self.browser_prefix
        browser = prefix is not None and (path == prefix or path.startswith(prefix + "/"))
        if not browser and not path.startswith(self.protected_prefix):
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and self._valid(token.strip()):
            await self.app(scope, receive, send)
            return
        if browser:
            if self._valid(_cookie(scope, COOKIE_NAME)):
                await self.app(scope, receive, send)
                return
            query_key = _query_value(scope, "api_key")
            if query_key is not None and self._valid(query_key):
                if path == prefix:
                    await _redirect_with_cookie(send, path, query_key)
                    return
                await self.app(scope, receive, send)
                return
        message = (
            "missing API key: send `Authorization: Bearer <key>`"
            + (" (a browser: open /dashboard?api_key=KEY)" if browser else "")
            if not auth
            else "incorrect API key provided"
        )
        await _send_error(
            send,
            401,
            message,
            "authentication_error",
            "invalid_api_key",
            [(b"www-authenticate", b"Bearer")],
        )

    def _valid(self, token: str | None) -> bool:
        return token is not None and secrets.compare_digest(token.encode(), self.api_key)


COOKIE_NAME = "heddle_api_key"


async def _redirect_with_cookie(send: Send, path: str, key: str) -> None:
    cookie = f"{COOKIE_NAME}={quote(key)}; Path=/dashboard; HttpOnly; SameSite=Strict"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", path.encode()),
                (b"set-cookie", cookie.encode("latin-1")),
                (b"content-length", b"0"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _cookie(scope: Scope, name: str) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return unquote(value)
    return None


def _query_value(scope: Scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
