"""A loopback TCP forwarder to put between chatgate and PostgreSQL, so a test can cut the network path
without stopping the shared PostgreSQL server (other tests use it at the same time)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TcpForwarder:
    """127.0.0.1:<port> -> 127.0.0.1:<target_port>.

    Modes: "open" relays bytes; "refuse" drops every connection and closes new ones at once (the server is
    gone); "blackhole" keeps sockets open but relays nothing (a dead network path: packets vanish).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.mode = "open"
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def set_mode(self, mode: str) -> None:
        assert mode in ("open", "refuse", "blackhole")
        self.mode = mode
        if mode == "refuse":
            asyncio.run_coroutine_threadsafe(self._drop_all(), self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._drop_all()

    async def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            writer.transport.abort()
            return
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            if self.mode == "blackhole":
                continue  # swallowed: nothing reaches the other side
            writer.write(data)
            await writer.drain()


@contextmanager
def forwarder(target_port: int) -> Iterator[TcpForwarder]:
    fwd = TcpForwarder(target_port)
    fwd.start()
    try:
        yield fwd
    finally:
        fwd.stop()
