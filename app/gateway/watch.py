"""Watching for the client's disconnect while an answer is relayed (an SSE stream, a file)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive


class ClientGone(Exception):
    """A write to the client failed: it has gone away."""


class ClientWatch:
    """While `relaying`, a client that goes away (uvicorn's http.disconnect) cancels the relaying task at
    once, not at the next write; `gone` says so afterwards."""

    def __init__(self) -> None:
        self.gone = False
        self.relaying = False

    @contextlib.asynccontextmanager
    async def watching(self, receive: Receive, enabled: bool = True) -> AsyncIterator[None]:
        """The relay runs in the body; it ends quietly if the client went away (ClientGone, or the
        cancellation the watcher caused). `enabled=False`: the request's body is still unread (the watcher
        would take its chunks)."""
        task = asyncio.current_task()
        assert task is not None
        self.relaying = True
        watcher = asyncio.create_task(self._watch(receive, task)) if enabled else None
        try:
            yield
        except ClientGone:
            self.gone = True
        except asyncio.CancelledError:
            if not self.gone:
                raise
            task.uncancel()
        finally:
            self.relaying = False
            if watcher is not None:
                watcher.cancel()

    async def _watch(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                if self.relaying:
                    task.cancel()
                return
