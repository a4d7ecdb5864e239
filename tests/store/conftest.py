from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chatgate.store import Store, open_store
from tests.pgutil import fresh_database

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store of each backend: a new SQLite file or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        with fresh_database() as url:
            yield url


@pytest.fixture
def make_store(store_url: str) -> Iterator[Callable[[], Store]]:
    """Open more stores on the same URL (as other replicas or processes would); all closed at teardown."""
    stores: list[Store] = []

    def make() -> Store:
        stores.append(open_store(store_url))
        return stores[-1]

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    store = make_store()
    store.migrate()
    return store


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


class TcpProxy:
    """Forwards a local port to PostgreSQL; stop() is a server outage, start() brings it back.

    With `blackhole` set, connections stay open but nothing is relayed: a dead network path.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._acceptor = threading.Thread()
        self.blackhole = False

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, args=(listener, self._stopped), daemon=True)
        self._acceptor.start()

    def stop(self) -> None:
        """Refuse new connections, then cut the open ones."""
        self._stopped.set()
        self._acceptor.join()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket, stopped: threading.Event) -> None:
        with listener:
            while not stopped.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                try:
                    upstream = socket.create_connection(self.target)
                except OSError:
                    client.close()
                    continue
                with self._lock:
                    self._sockets += [client, upstream]
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        _pump(src, dst, lambda: self.blackhole)


def _pump(src: socket.socket, dst: socket.socket, blackhole: Callable[[], bool]) -> None:
    try:
        while data := src.recv(65536):
            if not blackhole():
                dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def pg_proxy_url(pg_url: str) -> Iterator[tuple[TcpProxy, str]]:
    """A fresh database reached through a TcpProxy, and the URL that goes through it."""
    parts = urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy.start()
    user = parts.netloc.rpartition("@")[0]
    yield proxy, parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}").geturl()
    proxy.stop()
