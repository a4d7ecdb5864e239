"""Shared bits of the quota tests: limits written to the store, the openai SDK as the client, a webhook
receiver, and a redis-server of the test's own (to stop and start)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai

from chatgate.gateway.auth import fingerprint
from chatgate.store import open_store
from chatgate.store.base import LimitRow
from tests import lifeline
from tests.ci import missing
from tests.harness import free_port


def usd(amount: str) -> int:
    """USD to picoUSD, the store's unit."""
    return int(Decimal(amount) * 10**12)


def set_limits(store_url: str, scope: str, subject: str, **limits: Any) -> None:
    """What `chatgate keys set` / the admin API write: one limits row, straight into the store."""
    store = open_store(store_url)
    try:
        store.migrate()
        store.set_limits(LimitRow(scope, subject, updated_at=time.time(), **limits))
    finally:
        store.close()


def key_subject(secret: str) -> str:
    """The key a passthrough caller is metered and limited as."""
    return fingerprint(secret)


def client(url: str, secret: str, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=max_retries, timeout=30)


def ask(url: str, secret: str, n: int = 0, max_tokens: int | None = 16, **extra: Any) -> Any:
    """One small chat completion with the real SDK; its raw response (status, headers, parsed body)."""
    kwargs: dict[str, Any] = {"max_tokens": max_tokens} if max_tokens is not None else {}
    return client(url, secret).chat.completions.with_raw_response.create(
        model="deepseek-flash", messages=[{"role": "user", "content": f"Question {n}: what is 2 + 2?"}],
        **kwargs, **extra)


@dataclass
class Webhook:
    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    fail_first: int = 0  # answer this many POSTs with a 500 first

    def wait(self, count: int, timeout: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.received)


@contextmanager
def webhook_receiver(fail_first: int = 0) -> Iterator[Webhook]:
    """An HTTP endpoint on loopback that records the JSON POSTed to it."""
    hook = Webhook("", fail_first=fail_first)
    attempts = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            attempts[0] += 1
            if attempts[0] <= hook.fail_first:
                self.send_response(500)
                self.end_headers()
                return
            hook.received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


class RedisServer:
    """A redis-server of this test's own on a free loopback port, without persistence."""

    def __init__(self, tmp_path: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.dir = tmp_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.binary is not None
        self.process = lifeline.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
