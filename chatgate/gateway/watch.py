"""Watching for the client's disconnect while an answer is relayed (an SSE stream, a file)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from starlette.types import Receive


class ClientGone(Exception):
    """A write to the client failed: it has gone away."""


class ClientWatch:
    """While `relaying`, a client that goes away (uvicorn's http.disconnect) cancels the relaying task at
    once, not at the next write; `gone` says so afterwards.

    `async with watch.watching(receive):` runs the relay in its body; it ends quietly if the client went
    away (ClientGone, or the cancellation the watcher caused). The watcher (a task reading `receive`) starts
    on entry, or with `lazy=True` only when `arm()` is called: the SSE relay arms it before its first wait
    on DeepSeek, so a stream already received whole is relayed without a task of its own (a client gone
    while its writes are in flight only makes uvicorn drop them). `enabled=False`: never started (the
    request's body is still unread: the watcher would take its chunks).
    """

    __slots__ = ("_lazy", "_receive", "_task", "_watcher", "gone", "relaying")

    def __init__(self) -> None:
        self.gone = False
        self.relaying = False
        self._receive: Receive | None = None
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._lazy = False

    def watching(self, receive: Receive, enabled: bool = True, lazy: bool = False) -> ClientWatch:
        self._receive = receive if enabled else None
        self._lazy = lazy
        return self

    async def __aenter__(self) -> None:
        self._task = asyncio.current_task()
        assert self._task is not None
        self.relaying = True
        if not self._lazy:
            self.arm()

    def arm(self) -> None:
        """Start the watcher (once; not after the relay ended, nor when not `enabled`)."""
        if self._watcher is None and self._receive is not None and self.relaying and self._task is not None:
            self._watcher = asyncio.create_task(self._watch(self._receive, self._task))

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        self.relaying = False
        if self._watcher is not None:
            self._watcher.cancel()
        if kind is None:
            return False
        if issubclass(kind, ClientGone):
            self.gone = True
            return True
        if issubclass(kind, asyncio.CancelledError) and self.gone:
            assert self._task is not None
            self._task.uncancel()
            return True
        return False

    async def _watch(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                if self.relaying:
                    task.cancel()
                return
