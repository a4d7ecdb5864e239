"""Running uvicorn: one listening socket, watched by several accept listeners, and an HTTP protocol that
bounds what a request's head may cost.

libuv, under uvloop, accepts one connection per listener each time round the event loop (libuv PR
#3696, "don't accept() connections in a loop"). With thousands of streams in flight a round takes tens of
milliseconds, so a single listener takes in a few dozen connections a second and new clients wait in
the kernel's accept queue for seconds. Duplicates of the listening socket are more listeners on the same
queue: up to `accept_listeners` connections are accepted per round, for the price of a failed accept()
per idle listener in a round where fewer arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.supervisors import Multiprocess

from app.errors import APIError
from app.gateway.http_limits import headers_too_large
from app.gateway.responses import HEAD_BLOCK
from app.settings import LimitsSettings, ServerSettings

HEAD_TIMEOUT_S = 30.0  # for the rest of a request's head, or the next piece of its body
HEAD_ROOM = 16384  # for the request line, beside twice the header limit
DESCRIPTORS_SPARE = 64  # kept for the store, the spool, logs and the listeners
log = logging.getLogger("chatgate")


class OneWriteResponses:
    """The transport as a request's cycle sees it: a response's head is held until its body's first write in
    the same turn of the event loop, and both go out in one write (uvicorn writes the head alone, so every
    buffered answer cost two writes and the client two segments). A head with no body write in that turn (a
    stream waiting for its first event) goes out at the turn's end; writes keep their order."""

    __slots__ = ("_head", "_hold", "loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport, self.loop = transport, loop
        self._hold = False
        self._head: bytes | None = None

    def arm(self) -> None:
        """The next write is a response's head (or uvicorn's 100 Continue): hold it."""
        self._hold = True

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self.transport.writelines((head, data))
        elif self._hold:
            self._hold = False
            self._head = data
            self.loop.call_soon(self.flush)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


NAMES_KEPT = 1024  # header names known to be valid (a small vocabulary: DeepSeek's and chatgate's)


class OneCheckHeads(RequestResponseCycle):
    """uvicorn's request cycle, writing what uvicorn writes (tests/server/test_one_check_heads.py compares the
    two), with a response head checked at once: uvicorn runs two regular expressions on every header and
    copies it line by line. Here a name already seen valid is a set look-up, the values are searched in one
    pass (a forbidden byte is one whatever its neighbours), and a start message may carry header lines
    rendered by chatgate from numbers (`HEAD_BLOCK`, app/gateway/responses.py), written as they are. Every
    cycle of the process is one (`configure`): with two cycle classes alive, each attribute site of uvicorn's
    code would see two types (measured: 1.3% of a request)."""

    valid_names: set[bytes] = set()

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if self.response_started:
            self._body(message)
        elif message["type"] != "http.response.start" or self.access_log:
            await super().send(message)  # uvicorn's error, or its access log line
        else:
            self._start(message)

    def _start(self, message: Any) -> None:
        headers = self.default_headers + list(message.get("headers", []))
        names = self.valid_names
        for name, _ in headers:
            if name not in names:
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if len(names) >= NAMES_KEPT:
                    names.clear()
                names.add(name)
        if HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        block = message.get(HEAD_BLOCK)
        if block:
            content.append(block)
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

    def _body(self, message: Any) -> None:
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already "
                               "completed.")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
        elif self.chunked_encoding:
            content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                content.append(b"0\r\n\r\n")
            self.transport.write(b"".join(content))
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a request head that may cost so much and take so long: httptools
    buffers a head without a bound (an endless header grew a process by 500 MB) and uvicorn waits for it
    without end (a client sending a header line every few seconds held its connection forever). Past
    `config.h11_max_incomplete_event_size` bytes (the same bound uvicorn's h11 protocol takes from it) the
    answer is a 431 and the connection closes; when the rest of a head, or the next piece of a body, does
    not come within HEAD_TIMEOUT_S, the connection closes (a body sent slowly but steadily is the app's to
    bound: limits.body_timeout_seconds). No timer runs for a request that arrives in one piece. The 431 in
    the OpenAI shape for a head over limits.max_header_bytes comes from the app (app/gateway/http_limits.py).

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
        self._responses: OneWriteResponses | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._responses = OneWriteResponses(transport, self.loop)
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
        cycle, responses = self.cycle, self._responses
        if type(cycle) is OneCheckHeads:  # its start message may carry a block of header lines
            extensions = self.scope.get("extensions")
            if extensions is None:
                self.scope["extensions"] = {HEAD_BLOCK: {}}
            else:
                extensions[HEAD_BLOCK] = {}
        if cycle is not None and responses is not None and cycle.transport is self.transport:
            responses.arm()
            cycle.transport = responses  # type: ignore[assignment]

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


def protocol_options(limits: LimitsSettings, server: ServerSettings | None = None) -> dict[str, Any]:
    """uvicorn.Config's protocol and the bound on a request's head: the app's header limit (its 431 in the
    OpenAI shape), plus room for the request line; the head timeout and the connection cap of `server`."""
    configure(server or ServerSettings())
    return {"http": BoundedHttpToolsProtocol,
            "h11_max_incomplete_event_size": 2 * limits.max_header_bytes + HEAD_ROOM}


def configure(server: ServerSettings) -> None:
    """The head timeout and the connection cap, on the protocol class: uvicorn pickles its Config (and the
    class in it, by name) into `--workers` processes, which call this again from the app factory."""
    BoundedHttpToolsProtocol.head_timeout = server.head_timeout_seconds
    httptools_impl.RequestResponseCycle = OneCheckHeads  # type: ignore[misc]  # the name uvicorn makes them by
    BoundedHttpToolsProtocol.max_connections = server.max_connections or auto_max_connections()


def auto_max_connections() -> int:
    """What the descriptor limit allows: a client connection may need an upstream one beside it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 0
    return max(16, (soft - DESCRIPTORS_SPARE) // 2)


def listeners(sock: socket.socket, count: int) -> list[socket.socket]:
    """The listening socket and `count - 1` duplicates of it (one accept queue, `count` watchers)."""
    return [sock, *(sock.dup() for _ in range(max(count, 1) - 1))]


def run(config: uvicorn.Config, accept_listeners: int) -> bool:
    """uvicorn.run's own sequence, with the listeners above; False when the server did not start."""
    server = uvicorn.Server(config)
    sock = config.bind_socket()
    socks = listeners(sock, accept_listeners)
    try:
        if config.workers > 1:
            Multiprocess(config, sockets=socks).run()
            return True
        server.run(sockets=socks)
    except KeyboardInterrupt:
        pass
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        if config.uds and os.path.exists(config.uds):
            os.remove(config.uds)
    return server.started
