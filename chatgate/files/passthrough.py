"""DeepSeek's answer relayed as it comes, for the routes chatgate neither checks nor meters (the Files API):
its status and headers, then its body chunk by chunk, never held whole (a file's content can be large).

The body is relayed as DeepSeek sent it (decoded only if DeepSeek compressed it although chatgate asked for
identity), with its Content-Length when it gave one. A client that goes away closes the upstream response
at once. A body that breaks or stalls past upstream.total_timeout is left incomplete: the connection is
closed without the body's end, which the client's HTTP library reports as an error (a cut file must never
look whole).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx2
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from chatgate.gateway.upstream import Answer, body_chunks, map_transport_error, response_headers
from chatgate.gateway.watch import ClientGone, ClientWatch

# Called once when the relay is over: (outcome, status, code).
OnEnd = Callable[[str, int, str | None], None]
BROKEN = "upstream_body_broken"


class Passthrough(Response):
    """A Starlette Response only in type (route handlers return it); `__call__` does all the sending.

    `watch`: whether to watch for the client's disconnect; only once the request body has been read to its
    end, since the watcher would otherwise take the body's chunks for itself."""

    def __init__(self, resp: Answer, request_id: str, deadline: float, on_end: OnEnd,
                 watch: bool = True) -> None:
        self.status_code = resp.status_code
        self.background = None
        self.resp = resp
        self.raw_headers = response_headers(resp.raw_headers, request_id)
        length = resp.header("content-length")
        if length is not None and resp.header("content-encoding") is None:
            self.raw_headers.append((b"content-length", length.encode("latin-1")))
        self.deadline = deadline
        self.on_end = on_end
        self.watch = watch
        self.client = ClientWatch()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        end: tuple[str, int, str | None] = ("client_disconnected", 499, None)
        try:
            async with self.client.watching(receive, self.watch):
                end = await self._relay(send)
        finally:
            self.on_end(*end)
            await self.resp.aclose()

    async def _relay(self, send: Send) -> tuple[str, int, str | None]:
        await self._send(send, {"type": "http.response.start", "status": self.status_code,
                                "headers": self.raw_headers})
        try:
            async with asyncio.timeout(max(self.deadline - time.perf_counter(), 0.001)):
                async for chunk in body_chunks(self.resp):
                    await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
        except (TimeoutError, httpx2.HTTPError, aiohttp.ClientError, OSError) as exc:
            if self.client.gone:
                raise ClientGone() from exc
            return "upstream_failed", map_transport_error(exc).status, BROKEN  # left incomplete: see above
        self.client.relaying = False  # the client has it all: its going away no longer matters
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        return ("ok" if 200 <= self.status_code < 300 else "upstream_error"), self.status_code, None

    @staticmethod
    async def _send(send: Send, message: dict[str, Any]) -> None:
        try:
            await send(message)
        except OSError as exc:  # a server that reports the client's disconnect on send
            raise ClientGone() from exc
