"""chatgate/server.py: the accept listeners share one accept queue, and `chatgate serve` really opens them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from chatgate.server import listeners
from tests.harness import free_port, spawn_chatgate

pytestmark = pytest.mark.slow  # `chatgate serve` as a process


def test_listeners_are_duplicates_of_one_listening_socket() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    socks = listeners(sock, 5)
    try:
        assert len(socks) == 5 and socks[0] is sock
        assert {s.getsockname() for s in socks} == {sock.getsockname()}
        clients = [socket.create_connection(sock.getsockname()) for _ in range(3)]
        for s in socks[-1], socks[2], socks[0]:  # any listener takes any connection: one queue
            s.settimeout(5)
            conn, _ = s.accept()
            conn.close()
        for c in clients:
            c.close()
    finally:
        for s in socks:
            s.close()


def test_one_listener_is_just_the_socket() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    with sock:
        assert listeners(sock, 1) == [sock]
        assert listeners(sock, 0) == [sock]


def _listening_inode(port: int) -> str:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on {port}")


def _fds_on(pid: int, inode: str) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]"
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_serve_watches_its_socket_with_the_configured_listeners(tmp_path: Path) -> None:
    env = {"CHATGATE_SERVER_ACCEPT_LISTENERS": "6", "CHATGATE_STORE_URL": "none"}
    with spawn_chatgate(tmp_path, env=env) as cg:
        assert _fds_on(cg.process.pid, _listening_inode(cg.port)) == 6
        for _ in range(20):  # new connections, each accepted by one of them
            with httpx2.Client() as client:
                assert client.get(cg.url + "/healthz").status_code == 200


def test_serve_exits_3_when_the_port_is_taken(tmp_path: Path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        out = subprocess.run([sys.executable, "-m", "chatgate", "serve", "--port", str(port)],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**os.environ, "CHATGATE_STORE_URL": "none"})
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr and "--port" in out.stderr
