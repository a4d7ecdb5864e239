"""What the gateway sends back: JSON, chatgate's own errors, and DeepSeek's answers as they came."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from chatgate.errors import APIError
from chatgate.gateway.family import Family

JSON = "application/json"


class HeadLines(Protocol):
    """Headers chatgate renders itself from numbers (the x-ratelimit headers)."""

    def headers(self) -> list[tuple[bytes, bytes]]: ...


def response_start(status: int, headers: list[tuple[bytes, bytes]],
                   lines: HeadLines | None) -> dict[str, Any]:
    """The `http.response.start` message, `lines` after the other headers."""
    if lines is not None:
        headers = [*headers, *lines.headers()]
    return {"type": "http.response.start", "status": status, "headers": headers}


def json_response(status: int, content: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status, headers=headers, media_type=JSON)


def error_response(error: APIError, request_id: str | None = None, family: Family | None = None) -> Response:
    """chatgate's own error, in the shape of the API family the request was for (OpenAI's by default)."""
    headers = dict(error.headers)
    if request_id:
        headers["x-request-id"] = request_id
    if family is None:
        return Response(error.to_json(), error.status, headers=headers, media_type=JSON)
    body, extra = family.render_error(error, request_id)
    return Response(body, error.status, headers={**headers, **extra}, media_type=JSON)


class RawResponse(Response):
    """DeepSeek's status, headers and body as they came: no decoding and re-encoding of the headers.

    `before_send` (the usage record) runs before anything is sent: once the client has the end of the
    answer, its record is spooled (a `kill -9` between the two cannot lose it), and a client gone
    mid-send still leaves its record."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 before_send: Callable[[], None] | None = None, lines: HeadLines | None = None) -> None:
        self.status_code = status
        self.body = body
        self.background = None
        self.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        self.before_send = before_send
        self.lines = lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.before_send is not None:
            self.before_send()
        await send(response_start(self.status_code, self.raw_headers, self.lines))
        await send({"type": "http.response.body", "body": self.body})


def is_event_stream(value: str) -> bool:
    return value.split(";", 1)[0].strip().lower() == "text/event-stream"
