"""Serve the fake on a loopback port from a background thread (what `chatgate demo` puts behind chatgate)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from chatgate.demo.app import create_fake_app
from chatgate.demo.deepseek import FakeState


@contextmanager
def serve_in_thread(state: FakeState, host: str = "127.0.0.1") -> Iterator[str]:
    """The fake's base URL while it serves on a free port of `host`; stopped on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    config = uvicorn.Config(create_fake_app(state), lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=1, timeout_keep_alive=30, log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="demo-upstream",
                              daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the demo's stand-in for DeepSeek did not start")
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
