"""uvicorn's httptools protocol, with a bound on what a request's head may cost: the one module of chatgate
that subclasses a uvicorn class. It overrides the protocol's callbacks and reads its attributes (`config`,
`connections`, `flow`, `loop`, `transport`), none of which uvicorn documents, so it is written for one uvicorn
release: pyproject.toml pins that one exactly, and `check_uvicorn` refuses to start on any other.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chatgate.errors import APIError
from chatgate.gateway.http_limits import headers_too_large

HEAD_TIMEOUT_S = 30.0  # for the rest of a request's head, or the next piece of its body
HEAD_ROOM = 16384  # for the request line, beside twice the header limit
UVICORN = "0.55.0"  # the release BoundedHttpToolsProtocol is written for (pyproject.toml: uvicorn==)
log = logging.getLogger("chatgate")


class UvicornMismatch(RuntimeError):
    """Another uvicorn than the one chatgate's HTTP protocol is written for."""


def check_uvicorn(installed: str | None = None) -> None:
    """Refuse to run on a uvicorn release other than UVICORN: its protocol's internals may differ, and a
    head that is not bounded, or a protocol that fails on the first request, is found only in production."""
    installed = uvicorn.__version__ if installed is None else installed
    if installed != UVICORN:
        raise UvicornMismatch(
            f"chatgate's HTTP protocol (chatgate/uvicorn_protocol.py) is written for uvicorn {UVICORN}, and "
            f"uvicorn {installed} is installed: install the version chatgate pins (pip install "
            f"'uvicorn[standard]=={UVICORN}', or reinstall chatgate), or upgrade chatgate.")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a request head that may cost so much and take so long: httptools
    buffers a head without a bound (an endless header grew a process by 500 MB) and uvicorn waits for it
    without end (a client sending a header line every few seconds held its connection forever). Past
    `config.h11_max_incomplete_event_size` bytes (the same bound uvicorn's h11 protocol takes from it) the
    answer is a 431 and the connection closes; when the rest of a head, or the next piece of a body, does
    not come within HEAD_TIMEOUT_S, the connection closes (a body sent slowly but steadily is the app's to
    bound: limits.body_timeout_seconds). No timer runs for a request that arrives in one piece. The 431 in
    the OpenAI shape for a head over limits.max_header_bytes comes from the app
    (chatgate/gateway/http_limits.py).

    A connection's clock starts when it opens: one that sends no request head within `head_timeout` is
    closed (uvicorn's keep-alive timeout starts only after a first response; 1,000 sockets that sent nothing
    held the process's descriptors until real clients were reset). Beyond `max_connections` open at once a
    new connection is answered 503 and closed.
    """

    head_timeout = HEAD_TIMEOUT_S
    max_connections = 0  # 0: no cap

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_limit = self.config.h11_max_incomplete_event_size or 0
        self._head_bytes = 0
        self._in_head = True
        self._messages = 0  # requests read whole on this connection
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusing = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections and len(self.connections) > self.max_connections:
            self._refusing = True  # answered when its request comes, so that it reads the answer
            self._head_timer = self.loop.call_later(1.0, self.transport.close)
            return
        self._head_timer = self.loop.call_later(self.head_timeout, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            self._refuse_connection()
            return
        in_head, messages = self._in_head, self._messages
        super().data_received(data)
        if self._messages != messages:  # a request read whole (most: head and body in one piece)
            self._stop_timer()
        elif self._in_head:
            if in_head:  # all of it was head: the clock starts at a head's first piece that did not end it
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(self.head_timeout, self._too_slow)
                self._head_bytes += len(data)
                if self._head_limit and self._head_bytes > self._head_limit:
                    self._refuse_head()
        else:  # in a body that goes on: each piece gives the next one HEAD_TIMEOUT_S to come
            self._stop_timer()
            self._head_timer = self.loop.call_later(self.head_timeout, self._too_slow)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # the next request on this connection
        self._messages += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if self.flow is not None and self.flow.read_paused:  # chatgate is the slow reader, not the client
            self._head_timer = self.loop.call_later(self.head_timeout, self._too_slow)
            return
        self.transport.close()

    def _refuse_connection(self) -> None:
        self._stop_timer()
        self._refusing = False
        log.warning("refused a connection: %d open (server.max_connections)", len(self.connections) - 1)
        body = APIError(503, f"chatgate has {self.max_connections} connections open "
                        "(server.max_connections); retry shortly.", "server_error", None,
                        "too_many_connections").to_json()
        head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n")
        self.transport.write(head + body)
        self.transport.close()

    def _refuse_head(self) -> None:
        self._stop_timer()
        body = headers_too_large((self._head_limit - HEAD_ROOM) // 2).to_json()
        head = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n")
        self.transport.write(head + body)
        self.transport.close()
