"""Running uvicorn: one listening socket, watched by several accept listeners, and an HTTP protocol that
bounds what a request's head may cost (chatgate/uvicorn_protocol.py).

libuv, under uvloop, accepts one connection per listener each time round the event loop (libuv PR
#3696, "don't accept() connections in a loop"). With thousands of streams in flight a round takes tens of
milliseconds, so a single listener takes in a few dozen connections a second and new clients wait in
the kernel's accept queue for seconds. Duplicates of the listening socket are more listeners on the same
queue: up to `accept_listeners` connections are accepted per round, for the price of a failed accept()
per idle listener in a round where fewer arrive.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from chatgate.settings import LimitsSettings, ServerSettings
from chatgate.uvicorn_protocol import HEAD_ROOM, BoundedHttpToolsProtocol, check_uvicorn

DESCRIPTORS_SPARE = 64  # kept for the store, the spool, logs and the listeners


def protocol_options(limits: LimitsSettings, server: ServerSettings | None = None) -> dict[str, Any]:
    """uvicorn.Config's protocol and the bound on a request's head: the app's header limit (its 431 in the
    OpenAI shape), plus room for the request line; the head timeout and the connection cap of `server`."""
    configure(server or ServerSettings())
    return {"http": BoundedHttpToolsProtocol,
            "h11_max_incomplete_event_size": 2 * limits.max_header_bytes + HEAD_ROOM}


def configure(server: ServerSettings) -> None:
    """The head timeout and the connection cap, on the protocol class: uvicorn pickles its Config (and the
    class in it, by name) into `--workers` processes, which call this again from the app factory. Raises
    UvicornMismatch on a uvicorn release the protocol is not written for."""
    check_uvicorn()
    BoundedHttpToolsProtocol.head_timeout = server.head_timeout_seconds
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
