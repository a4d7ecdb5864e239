"""Running uvicorn: one listening socket, watched by several accept listeners.

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
import socket

import uvicorn
from uvicorn.supervisors import Multiprocess


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
