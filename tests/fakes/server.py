"""Run the fake DeepSeek on a real loopback port: in-process (thread) or as its own process.

In-process:   `with run_fake_deepseek() as fake: ... fake.url, fake.state`
Own process:  `python -m tests.fakes.server --port 0 [--usage-mode ...] [--chunk-delay S] [--no-validate] ...`
              prints `FAKE_DEEPSEEK_URL http://127.0.0.1:PORT` on stdout once it accepts connections;
              `with spawn_fake_deepseek() as fake:` does that for a test and gives a `FakeControl`.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from chatgate.demo.app import create_fake_app
from chatgate.demo.deepseek import USAGE_MODES, FakeState
from tests import lifeline

REPO_ROOT = Path(__file__).resolve().parents[2]
URL_LINE_PREFIX = "FAKE_DEEPSEEK_URL "
EXPECTED_LOG_LINES = ("ASGI callable returned without completing response.",)


class _DropExpectedNoise(logging.Filter):
    """uvicorn logs an error when the reset_mid_stream fault drops a connection on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in EXPECTED_LOG_LINES


def _quiet_uvicorn() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropExpectedNoise) for f in logger.filters):
        logger.addFilter(_DropExpectedNoise())


def bind_socket(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    # proto IPPROTO_TCP, not 0: only then does asyncio set TCP_NODELAY on accepted connections.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def make_server(state: FakeState, log_level: str = "warning") -> uvicorn.Server:
    config = uvicorn.Config(
        create_fake_app(state),
        lifespan="off",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
    )
    _quiet_uvicorn()
    return uvicorn.Server(config)


@dataclass
class RunningFake:
    url: str
    port: int
    state: FakeState
    server: uvicorn.Server


@contextmanager
def run_fake_deepseek(state: FakeState | None = None, port: int = 0) -> Iterator[RunningFake]:
    """Serve a fake DeepSeek from a background thread on 127.0.0.1; stop it on exit."""
    state = state if state is not None else FakeState()
    sock = bind_socket(port)
    server = make_server(state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        bound = sock.getsockname()[1]
        yield RunningFake(f"http://127.0.0.1:{bound}", bound, state, server)
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)
        sock.close()


def _wait_started(server: uvicorn.Server, thread: threading.Thread, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("fake DeepSeek did not start")
        time.sleep(0.01)


# -------------------------------------------------------------------------------- separate process


class FakeControl:
    """Client for the control endpoints of a fake running elsewhere."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client(base_url=url, timeout=30)

    def close(self) -> None:
        self.http.close()

    def requests(self, wait_idle: float = 0.0) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._get("/_fake/requests", wait_idle)
        return result

    def issued(self, wait_idle: float = 0.0) -> dict[str, Any]:
        result: dict[str, Any] = self._get("/_fake/issued", wait_idle)
        return result

    def config(self, **values: Any) -> dict[str, Any]:
        response = self.http.post("/_fake/config", json=values) if values else self.http.get("/_fake/config")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def reset(self) -> None:
        self.http.post("/_fake/reset").raise_for_status()

    def _get(self, path: str, wait_idle: float) -> Any:
        params = {"wait_idle": str(wait_idle)} if wait_idle else {}
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()


@dataclass
class SpawnedFake:
    url: str
    process: subprocess.Popen[str]
    control: FakeControl


@contextmanager
def spawn_fake_deepseek(*args: str, timeout: float = 20.0) -> Iterator[SpawnedFake]:
    """Start `python -m tests.fakes.server --port 0 *args` and wait for its URL line."""
    command = [sys.executable, "-m", "tests.fakes.server", "--port", "0", *args]
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    process = lifeline.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = _read_url(process, timeout)
        control = FakeControl(url)
        try:
            yield SpawnedFake(url, process, control)
        finally:
            control.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_url(process: subprocess.Popen[str], timeout: float) -> str:
    found: list[str] = []

    def reader() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(URL_LINE_PREFIX):
                found.append(line[len(URL_LINE_PREFIX) :].strip())
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        raise RuntimeError(f"fake DeepSeek process did not report its URL (exit code {process.poll()})")
    return found[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the fake DeepSeek upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port (printed on stdout)")
    parser.add_argument("--usage-mode", choices=USAGE_MODES, default="last_chunk")
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--keepalive-count", type=int, default=1)
    parser.add_argument("--nonstream-keepalive-lines", type=int, default=0)
    parser.add_argument("--fault", default=None)
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="accept chat bodies DeepSeek would refuse (only JSON objects are checked)",
    )
    parser.add_argument("--log-level", default="warning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    state = FakeState(
        usage_mode=args.usage_mode,
        chunk_delay=args.chunk_delay,
        keepalive_count=args.keepalive_count,
        nonstream_keepalive_lines=args.nonstream_keepalive_lines,
        fault=args.fault,
        validate=args.validate,
    )
    sock = bind_socket(args.port, args.host)
    server = make_server(state, args.log_level)
    threading.Thread(target=_announce, args=(server, sock), daemon=True).start()
    server.run(sockets=[sock])


def _announce(server: uvicorn.Server, sock: socket.socket) -> None:
    while not server.started:
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    print(f"{URL_LINE_PREFIX}http://{host}:{port}", flush=True)


if __name__ == "__main__":
    main()
