"""What clients send to chatgate, byte for byte: an ASGI wrapper (`run_chatgate(..., wrap=recorder.wrap)`),
and a guard that keeps in-process clients from reaching anything but this machine."""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class Exchange:
    """One HTTP request as the client sent it to chatgate, and chatgate's answer."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response: bytearray = field(default_factory=bytearray)
    query: str = ""  # the query string as sent (without the "?")

    @property
    def auth_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else None


class Recorder:
    """Keeps every exchange that passes through the wrapped app, in arrival order."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def recorded(scope: Scope, receive: Callable[[], Awaitable[Message]],
                           send: Callable[[Message], Awaitable[None]]) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            exchange = Exchange(scope["method"], scope["path"], headers,
                                query=scope.get("query_string", b"").decode("latin-1"))
            self.exchanges.append(exchange)

            async def receive_recorded() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    exchange.body += message.get("body", b"")
                return message

            async def send_recorded(message: Message) -> None:
                if message["type"] == "http.response.start":
                    exchange.status = message["status"]
                    exchange.response_headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                                                 for k, v in message.get("headers", [])}
                elif message["type"] == "http.response.body":
                    exchange.response += message.get("body", b"")
                await send(message)

            await app(scope, receive_recorded, send_recorded)

        return recorded


_guard_lock = threading.Lock()


@contextmanager
def loopback_only() -> Iterator[list[str]]:
    """Refuse name lookups of anything but loopback while the block runs; yields the hosts that were tried
    (a client library that fetches cost maps, encodings or telemetry shows up here)."""
    tried: list[str] = []
    original = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in LOOPBACK:
            tried.append(name)
            raise socket.gaierror(socket.EAI_NONAME, f"zoo: no network beyond this machine ({name})")
        return original(host, *args, **kwargs)

    with _guard_lock:
        socket.getaddrinfo = guarded
        try:
            yield tried
        finally:
            socket.getaddrinfo = original
