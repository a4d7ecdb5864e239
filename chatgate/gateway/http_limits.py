"""Request limits enforced before routing, as a pure ASGI middleware (no BaseHTTPMiddleware: it would buffer
and break streaming).

`limits.max_header_bytes`: the total size of the request headers (each counted as `name: value\\r\\n`); a
larger header block is answered 431 in the OpenAI error shape before any route, auth or body reading runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chatgate.errors import APIError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header_bytes(headers: list[tuple[bytes, bytes]]) -> int:
    """Bytes of the header block as sent: `name: value\\r\\n` per header."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def headers_too_large(limit: int) -> APIError:
    return APIError(431, f"Request headers are larger than {limit} bytes (limits.max_header_bytes).",
                    "invalid_request_error", None, "request_headers_too_large")


class LimitsMiddleware:
    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and header_bytes(scope.get("headers") or []) > self.max_header_bytes:
            error = headers_too_large(self.max_header_bytes)
            body = error.to_json()
            await send({"type": "http.response.start", "status": error.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
