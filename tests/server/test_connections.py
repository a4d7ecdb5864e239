"""Connections that cost without asking (issue 34 §3): a socket that sends no request head is closed after
server.head_timeout_seconds (uvicorn times out only the wait after a response); beyond
server.max_connections a new connection is answered 503; an upload trickled in is stopped below
limits.upload_min_bytes_per_second. Each with a stream and /healthz measured beside the attack
(tests/stalls.py: the bound)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import make_settings, run_chatgate
from tests.stalls import Beside

pytestmark = pytest.mark.slow  # attacks measured against a running server (tests/stalls.py)

IDLE = 300  # sockets that never send a byte


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


def idle_sockets(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), 10)
        s.settimeout(10)
        socks.append(s)
    return socks


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_sockets_that_send_nothing_are_closed(fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fake.url, server={"head_timeout_seconds": 2.0})
    with run_chatgate(settings) as gate, Beside(gate.url) as beside:
        socks = idle_sockets(gate.port, IDLE)
        t0 = time.monotonic()
        try:
            assert all(closed_by_server(s) for s in socks)
            assert time.monotonic() - t0 < 10
        finally:
            for s in socks:
                s.close()
        assert httpx2.get(gate.url + "/healthz").status_code == 200
    print(beside.report())
    beside.assert_unstalled()


def test_connections_beyond_the_cap_are_503(fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fake.url, server={"max_connections": 40, "head_timeout_seconds": 30})
    with run_chatgate(settings) as gate, Beside(gate.url) as beside:  # its connections are open already
        socks = idle_sockets(gate.port, 60)
        try:
            refused = httpx2.get(gate.url + "/healthz", timeout=10)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "too_many_connections"
            assert "retry-after" in refused.headers
        finally:
            for s in socks:
                s.close()
        deadline = time.monotonic() + 10
        while httpx2.get(gate.url + "/healthz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the slots were never given back"
            time.sleep(0.05)
    print(beside.report())
    beside.assert_unstalled()


def upload_head(length: int) -> bytes:
    return (b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-trickle\r\n"
            b"Content-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: "
            + str(length).encode() + b"\r\n\r\n--b0undary\r\nContent-Disposition: form-data; name=\"purpose\""
            b"\r\n\r\nuser_data\r\n--b0undary\r\nContent-Disposition: form-data; name=\"file\"; "
            b"filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\n")


def test_an_upload_trickled_in_is_stopped(fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fake.url, server={"head_timeout_seconds": 1.0},
                             limits={"upload_min_bytes_per_second": 1000})
    with run_chatgate(settings) as gate, Beside(gate.url) as beside, \
            socket.create_connection(("127.0.0.1", gate.port), 10) as conn:
        conn.sendall(upload_head(100_000))
        conn.settimeout(0.3)
        t0 = time.monotonic()
        answer = b""
        while not answer and time.monotonic() - t0 < 15:
            with contextlib.suppress(OSError):
                conn.sendall(b"x")  # one byte every 0.3 s: under the idle timeout, far under the rate
            with contextlib.suppress(TimeoutError):
                answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"limits.upload_min_bytes_per_second" in answer
        assert time.monotonic() - t0 < 10
    print(beside.report())
    beside.assert_unstalled()
