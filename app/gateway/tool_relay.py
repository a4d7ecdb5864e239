"""Relaying a tool API's answer (app/tools/): the newline keep-alives DeepSeek sends before an answer that
takes long (OCR) go to the client as they come; the answer itself is held until it is whole, then its record
is made (what it is billed for is read from it) and it is sent.

Before anything of an answer has arrived (keep-alives at most), a failure of the upstream is retried when
`reopen` is given: the new attempt's answer follows the keep-alives already sent, on the same client
response. A failure after part of the answer arrived, or once the retries are spent, ends the response: with
chatgate's error in its status if nothing was sent yet, else with the error's JSON after the keep-alives (as
DeepSeek itself answers an error that follows keep-alives).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx2
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import APIError
from app.gateway.exchange import Exchange
from app.gateway.responses import response_start
from app.gateway.upstream import Answer, map_transport_error, raw_chunks
from app.gateway.watch import ClientGone, ClientWatch

# Called once when the answer is over, before its end is sent: (exchange, outcome, status, the answer's
# bytes when it arrived whole, else None); it makes the exchange's record.
OnEnd = Callable[[Exchange, str, int, bytes | None], None]
Reopen = Callable[[APIError], Awaitable[Answer]]
FAILURES = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError)


class ToolRelay(Response):
    """A Starlette Response only in type (route handlers return it); `__call__` does all the sending."""

    def __init__(self, ex: Exchange, resp: Answer, deadline: float, on_end: OnEnd,
                 reopen: Reopen | None = None) -> None:
        self.status_code = resp.status_code
        self.background = None
        self.body = b""
        self.raw_headers = []
        self.ex = ex
        self.resp = resp
        self.deadline = deadline
        self.on_end = on_end
        self.reopen = reopen
        self.client = ClientWatch()
        self._started = False  # the status and headers went out (with the first keep-alive)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with self.client.watching(receive):  # the body has been read whole: the watcher may read
                await self._relay(scope, send)
        finally:
            await self.resp.aclose()
            if not self.ex.finished:
                self.on_end(self.ex, "client_disconnected", 499, None)

    async def _relay(self, scope: Scope, send: Send) -> None:
        held: list[bytes] = []
        while True:
            try:
                async with asyncio.timeout(max(self.deadline - time.perf_counter(), 0.001)):
                    async for chunk in raw_chunks(self.resp):
                        if not held and not chunk.strip():  # a keep-alive before the answer
                            await self._keepalive(scope, send, chunk)
                        elif chunk:
                            held.append(chunk)
                break
            except FAILURES as exc:
                if self.client.gone:
                    raise ClientGone() from exc
                error = map_transport_error(exc)
                if held or self.reopen is None:
                    await self._failed(scope, send, error)
                    return
                await self.resp.aclose()
                try:
                    self.resp = await self.reopen(error)
                except APIError as spent:
                    await self._failed(scope, send, spent)
                    return
        content = b"".join(held)
        status = self.resp.status_code
        self.on_end(self.ex, "ok" if status == 200 else "upstream_error", status, content)
        if not self._started:
            headers = [*self.ex.response_headers(self.resp), (b"content-length", str(len(content)).encode())]
            await self._send(send, response_start(scope, status, headers, self.ex.rate_headers))
        self.client.relaying = False  # the client has it all: its going away no longer matters
        await self._send(send, {"type": "http.response.body", "body": content, "more_body": False})

    async def _keepalive(self, scope: Scope, send: Send, chunk: bytes) -> None:
        if not self._started:
            self._started = True
            await self._send(send, response_start(scope, self.resp.status_code,
                                                  self.ex.response_headers(self.resp), self.ex.rate_headers))
        await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})

    async def _failed(self, scope: Scope, send: Send, error: APIError) -> None:
        self.on_end(self.ex, "upstream_failed", error.status, None)
        body = error.to_json()
        if not self._started:
            extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"x-request-id", self.ex.request_id.encode("latin-1")), *extra]
            await self._send(send, response_start(scope, error.status, headers, self.ex.rate_headers))
        await self._send(send, {"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    async def _send(send: Send, message: dict[str, object]) -> None:
        try:
            await send(message)
        except OSError as exc:  # a server that reports the client's disconnect on send
            raise ClientGone() from exc
