"""Run chatgate for real in tests: in-process on a loopback port (uvicorn in a thread), or as its own
process (`python -m chatgate serve`), for kill -9, SIGTERM and multi-replica tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from chatgate.server import protocol_options
from chatgate.settings import Settings
from chatgate.web.app import create_app
from tests import lifeline
from tests.fakes.server import bind_socket

REPO_ROOT = Path(__file__).resolve().parents[1]
# An admin key chatgate accepts at start (at least 32 characters, not a placeholder: issue 48)
ADMIN_KEY = "test-admin-key-0123456789abcdef-0123456789abcdef"


def make_settings(tmp_path: Path, upstream_url: str = "http://127.0.0.1:9", **sections: dict[str, Any]
                  ) -> Settings:
    """Settings for a test: SQLite and spool under tmp_path, the given upstream, overrides per section.
    Upstream retries are off unless a test turns them on (tests/gateway/test_retries.py): a fault the fake
    injects reaches the client as it was injected. Refusals are not confirmed with DeepSeek
    (validation.confirm_every_s = 0) unless a test asks: a refused request never reaches the fake
    (tests/confirmation/ asks)."""
    data: dict[str, Any] = {
        "upstream": {"base_url": upstream_url, "retries": 0},
        "validation": {"confirm_every_s": 0},
        "store": {"url": f"sqlite:///{tmp_path}/usage.db", "spool_dir": str(tmp_path / "spool"),
                  "flush_interval_ms": 5},
        "server": {"access_log": False},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return Settings.model_validate(data)


class _TestServer(uvicorn.Server):
    """uvicorn's Server, stopped without its fixed waits: `stop()` wakes the main loop at once (uvicorn
    checks `should_exit` every 0.1 s), and the shutdown polls the open connections and tasks every 5 ms
    (uvicorn sleeps 0.1 s after asking the connections to close, then polls every 0.1 s): ~0.2 s for each of
    the ~500 in-process servers a run starts. What the shutdown does, and in what order, is uvicorn's: close
    the listeners, ask each connection to shut down, wait for them and for the tasks (up to the graceful
    timeout, then cancel the tasks), then the lifespan's shutdown."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def stop(self) -> None:
        """Ask the server to exit, from any thread."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await asyncio.sleep(0)
        deadline = time.monotonic() + (self.config.timeout_graceful_shutdown or 0)
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if state.tasks and not self.force_exit:
            for task in state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


@dataclass
class RunningChatgate:
    url: str
    port: int
    app: Any
    server: uvicorn.Server

    @property
    def state(self) -> Any:
        return self.app.state.chatgate


@contextmanager
def run_chatgate(settings: Settings, transport: Any = None, store: Any = None, loop: str = "uvloop",
                 wrap: Callable[[Any], Any] | None = None, clock: Callable[[], float] | None = None
                 ) -> Iterator[RunningChatgate]:
    """chatgate in this process on 127.0.0.1:<free port>, served by uvicorn (httptools) in a thread, on
    uvloop as `chatgate serve` runs (`loop="asyncio"` for the standard loop). `wrap`, if given, turns
    chatgate's ASGI app into the one served (e.g. a recorder of what clients send); `.app` stays
    chatgate's own. `clock`, if given, is the time requests are recorded, priced and limited at."""
    app = create_app(settings, transport=transport, store=store, **({"clock": clock} if clock else {}))
    sock = bind_socket()
    port = sock.getsockname()[1]
    served = app if wrap is None else wrap(app)
    config = uvicorn.Config(served, lifespan="on", log_level="warning", access_log=False, loop=loop,
                            timeout_graceful_shutdown=5, **protocol_options(settings.limits, settings.server))
    server = _TestServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("chatgate did not start")
        time.sleep(0.01)
    running = RunningChatgate(f"http://127.0.0.1:{port}", port, app, server)
    _RUNNING.append(running)
    try:
        yield running
    finally:
        _RUNNING.remove(running)
        server.stop()
        thread.join(15)
        sock.close()


_RUNNING: list[RunningChatgate] = []  # the in-process servers of this test process, started and not stopped


def _quiet(gate: RunningChatgate) -> bool:
    """Nothing left that could still make a record: no request in uvicorn's hands, no background task of the
    gateway, no record spooled and not yet in the store. Asked in the order the work is handed on (a request
    spawns its background task and spools its record before it ends), so a record in passage is seen."""
    state = gate.state
    return (not gate.server.server_state.tasks
            and (state.gateway is None or not state.gateway.background)
            and (state.recorder is None or state.recorder.pending == 0))


def settle(db: Path, longest: float = 0.1) -> None:
    """Wait until the in-process chatgate(s) writing to the SQLite file `db` are quiet (`_quiet`), for at most
    `longest` seconds (a test may hold another request open meanwhile); `longest` when none is found. For a
    test that counts records: a duplicate would be there once it returns."""
    gates = [g for g in list(_RUNNING) if g.state.settings.store.url == f"sqlite:///{db}"]
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline and not (gates and all(_quiet(g) for g in gates)):
        time.sleep(0.005)


@dataclass
class SpawnedChatgate:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def free_port() -> int:
    sock = bind_socket()
    port: int = sock.getsockname()[1]
    sock.close()
    return port


_UNREACHABLE: list[socket.socket] = []  # the socket behind unreachable_url(), held for the whole test session


def unreachable_url() -> str:
    """An upstream that refuses every connection: a port bound but never listened on, and kept bound, so
    no server started later (chatgate itself included) can take it, as one could a closed free_port()."""
    if not _UNREACHABLE:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # no listen(): a connection is refused at once
        _UNREACHABLE.append(sock)
    return f"http://127.0.0.1:{_UNREACHABLE[0].getsockname()[1]}"


@contextmanager
def spawn_chatgate(tmp_path: Path, *args: str, env: dict[str, str] | None = None, port: int | None = None,
                   cwd: Path | None = None, name: str = "chatgate", module: str = "chatgate"
                   ) -> Iterator[SpawnedChatgate]:
    """`python -m chatgate serve --port P ARGS…` as its own process; waits for /healthz. `module` runs a test
    build instead (e.g. `tests.pausebuild`), importable from the repository root."""
    port = port or free_port()
    log_path = tmp_path / f"{name}-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    full_env.setdefault("CHATGATE_STORE_SPOOL_DIR", str(tmp_path / "spool"))
    full_env["CHATGATE_VALIDATION_CONFIRM_EVERY_S"] = "0"  # as make_settings: unless the test's env asks
    full_env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # the default store: the test's own, not the user's
    if module != "chatgate":
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        # its own process group: `--workers N` forks workers that outlive a killed supervisor otherwise
        process = lifeline.Popen([sys.executable, "-m", module, "serve", "--port", str(port), *args],
                                 cwd=cwd or tmp_path, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    spawned = SpawnedChatgate(f"http://127.0.0.1:{port}", port, process, log_path)
    try:
        wait_healthy(spawned)
        yield spawned
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the server and any worker it left behind
        process.wait(10)
        lifeline.unwatch(process.pid, group=True)


def wait_healthy(spawned: SpawnedChatgate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if spawned.process.poll() is not None:
            raise RuntimeError(f"chatgate exited with {spawned.process.returncode}:\n{spawned.log()}")
        try:
            if httpx2.get(spawned.url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"chatgate did not become healthy:\n{spawned.log()}")
