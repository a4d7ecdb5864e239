"""Reading a request: its id, and its body within a size limit (JSON read whole, an upload as it arrives)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from starlette.requests import ClientDisconnect, Request

from chatgate.errors import APIError
from chatgate.ids import new_id

JSON = "application/json"


def request_id_of(request: Request) -> str:
    # the scope's own list (names lowercased by the server): Headers.get raises and catches a KeyError for
    # a header the client did not send, as most do not send this one
    rid = next((value.decode("latin-1") for name, value in request.scope["headers"]
                if name == b"x-request-id"), "")
    return rid if 0 < len(rid) <= 200 and rid.isascii() and rid.isprintable() else new_id()


def origin_of(request: Request) -> str:
    """chatgate's address as this client reached it (for hints such as "set base_url to …/beta")."""
    host = request.headers.get("host")
    if host is None or not host.isascii() or not host.isprintable() or len(host) > 255:
        server = request.scope.get("server") or ("127.0.0.1", 8787)
        host = f"{server[0]}:{server[1]}"
    root = request.scope.get("root_path", "")
    return f"{request.scope.get('scheme', 'http')}://{host}{root}"


def is_json_content_type(value: str) -> bool:
    media = value.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def read_json_body(request: Request, limit: int, timeout: float) -> Coroutine[Any, Any, bytes]:
    """The whole body, at most `limit` bytes, received within `timeout` seconds (a client that trickles it
    would otherwise hold its connection and handler without end): `read_whole_body` once the type is JSON
    (the 415 is raised at the call)."""
    if not is_json_content_type(request.headers.get("content-type", "")):
        raise APIError(415, "Request body must be JSON: send 'Content-Type: application/json'.",
                       "invalid_request_error", None, "unsupported_media_type")
    return read_whole_body(request, limit, timeout)


async def read_whole_body(request: Request, limit: int, timeout: float,
                          over: Callable[[int], APIError] | None = None) -> bytes:
    """The whole body of any type, at most `limit` bytes (else `over(limit)`, or `too_large`'s 413),
    received within `timeout` seconds. A tool API's upload is read so, checked and forwarded as one."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise (over or too_large)(limit)
    chunks: list[bytes] = []
    size = 0
    # Checked as pieces arrive (a timer per request would cost every request); a body that stops coming is
    # cut off by the server protocol (chatgate/server.py).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise (over or too_large)(limit)
        chunks.append(chunk)
        if loop.time() > deadline:
            raise APIError(408, f"The request body did not arrive within {timeout:g} s "
                           "(limits.body_timeout_seconds).", "invalid_request_error", None, "request_timeout")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one copy at most


def too_large(limit: int, setting: str = "limits.max_body_bytes") -> APIError:
    return APIError(413, f"Request body is larger than {limit} bytes ({setting}).",
                    "invalid_request_error", None, "request_too_large")


class BodyStopped(Exception):
    """An upload was cut off: over its limit, or its client went away."""


class Upload:
    """A request body relayed as it arrives, never held whole: at most `limit` bytes. A declared
    Content-Length over the limit is refused before anything is read (`check`); past the limit, or when the
    client goes away mid-body, iterating raises BodyStopped (which aborts the upstream request) and says which
    (`too_large`, `client_gone`). An upload also has a minimum rate: `grace` seconds plus one more for each
    `min_rate` bytes received (a client trickling one byte every 25 s, under the server's idle timeout, held
    its connection for good); slower, it is stopped too (`too_slow`, a 408)."""

    def __init__(self, request: Request, limit: int, setting: str, min_rate: float = 0.0,
                 grace: float = 30.0) -> None:
        self.request = request
        self.limit = limit
        self.setting = setting
        self.min_rate = min_rate
        self.grace = grace
        self.size = 0
        self.too_large = False
        self.too_slow = False
        self.client_gone = False
        self.done = False  # read to its end: nothing but the client's disconnect is left to receive
        self.tap: Callable[[bytes], None] | None = None  # sees each piece on its way (a document's count)

    def check(self) -> None:
        declared = self.request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            raise self.error()

    def error(self) -> APIError:
        if self.too_slow:
            return APIError(408, f"The upload arrived slower than {self.min_rate:g} bytes per second "
                            "(limits.upload_min_bytes_per_second).", "invalid_request_error", None,
                            "request_timeout")
        return too_large(self.limit, self.setting)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async for chunk in self.request.stream():
                self.size += len(chunk)
                if self.size > self.limit:
                    self.too_large = True
                    raise BodyStopped()
                if self.min_rate and loop.time() - start > self.grace + self.size / self.min_rate:
                    self.too_slow = True
                    raise BodyStopped()
                if chunk:
                    if self.tap is not None:
                        self.tap(chunk)
                    yield chunk
        except ClientDisconnect:
            self.client_gone = True
            raise BodyStopped() from None
        self.done = True
