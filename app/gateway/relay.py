"""Relay an upstream SSE stream to the client chunk by chunk, as it arrives.

A raw ASGI response: it watches for the client's disconnect while it waits on DeepSeek, so a client that
goes away closes the upstream request at once (not at the next chunk); the watcher and the deadline are
armed before the first such wait (what has arrived already is relayed without them). The chunk that ends
the stream's last event goes with `more_body: False` (one write with the chunked body's end). A stream
that breaks after it started ends with an error event in the family's format (the SDKs raise it), then
closes. The family's meter finds the usage and the stream's last event; the record is made before that
event is sent, and once it is relayed whole the answer is complete: the relay stops reading (what the
connection does after it is not the client's concern).

Before the first data event (only `: keep-alive` comments relayed, as DeepSeek sends while a request is
queued), a failure of the upstream is retried when `reopen` is given: the new attempt's events follow on the
same client response, which stays one well-formed stream (app/gateway/retry.py).

The end of a stream goes through `_end(outcome, status)`, which finishes the meter and calls `on_end` (the
gateway's `_stream_ended`: remember the turn, make the record). It is called from one of four places:
- `_relay_chunk`: the meter sees the stream's last event: ("ok", 200), before that event is relayed;
- `_pump`: DeepSeek's body ended without a last event: ("ok", 200), or ("upstream_error", 200) when it ended
  with DeepSeek's own error event;
- `_broken`: the stream broke (or no attempt answered): ("upstream_failed", status), before the error event;
- `__call__`: the client went away first: ("client_disconnected", 499), in a task of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import httpx2
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import APIError, bad_gateway
from app.gateway.exchange import Exchange
from app.gateway.family import ChunkFilter, StreamMeter
from app.gateway.responses import is_event_stream, response_start
from app.gateway.retry import only_keepalives
from app.gateway.upstream import Answer, KeptAliveOnly, map_transport_error, too_large
from app.gateway.watch import ClientGone, ClientWatch

# Called once when the upstream side of the stream has ended: (exchange, meter, outcome, status); it makes
# the exchange's record (the gateway's `_stream_ended`).
OnEnd = Callable[[Exchange, StreamMeter, str, int], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None]], None]
ErrorEvent = Callable[[APIError], bytes]
# A new attempt after one that failed with only keep-alives sent (its error): the response to relay, or the
# APIError (retries spent) to end the stream with.
Reopen = Callable[[APIError], Awaitable[Answer]]
UPSTREAM_FAILURES = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError, KeptAliveOnly)
DRAIN_S = 1.0  # how long the relay waits for the end of the upstream body once the client has the answer


class SSERelay(Response):
    """A Starlette Response only in type (route handlers return it); `__call__` does all the sending."""

    def __init__(self, ex: Exchange, resp: Answer, deadline: float, meter: StreamMeter,
                 on_end: OnEnd, spawn: Spawn, error_event: ErrorEvent,
                 chunk_filter: ChunkFilter | None = None, reopen: Reopen | None = None,
                 max_line: int | None = None) -> None:
        # Starlette's Response fields, set as its __init__ would (its headers are never sent: `_relay` sends
        # DeepSeek's)
        self.status_code = 200
        self.media_type = "text/event-stream"
        self.background = None
        self.body = b""
        self.raw_headers = [(b"content-type", b"text/event-stream")]
        self.on_end = on_end
        self.spawn = spawn
        self.error_event = error_event
        self.ex = ex
        self.resp = resp
        self.deadline = deadline
        self.meter = meter
        self.filter = chunk_filter
        self.trace = ex.trace
        self.client = ClientWatch()
        # (outcome, status) once the upstream side has ended; a disconnect after that does not change it
        self.end: tuple[str, int] | None = None
        self._partial = bytearray()  # an incomplete last line, held back until its newline arrives
        self.max_line = max_line  # the longest line held (limits.max_upstream_bytes); longer ends the stream
        self._final = False  # the stream's last event is being relayed: stop at the end of that event
        # Where the client is in the event stream: between events, or inside one that has a data line yet
        self._between = True
        self._open_data = False
        self.reopen = reopen
        self._pristine = True  # nothing but keep-alive comments received yet: a failure may be retried
        self._closed = False  # the client's response is complete (its last chunk went with more_body False)
        # The deadline and the client watch guard the waits on DeepSeek: both are armed before the first one
        # (a stream already received whole is relayed without a timer or a watcher task)
        self._timeout: asyncio.Timeout | None = None
        self._armed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with self.client.watching(receive, lazy=True):
                await self._relay(scope, send)
        finally:
            await self.resp.aclose()
            if not self.ex.finished:
                outcome, status = self.end or ("client_disconnected", 499)
                self.spawn(self._end(outcome, status))

    async def _relay(self, scope: Scope, send: Send) -> None:
        headers = self.ex.response_headers(self.resp)
        await send(response_start(scope, 200, headers, self.ex.rate_headers))
        try:
            try:
                while True:
                    try:
                        await self._pump(send)
                        break
                    except UPSTREAM_FAILURES as exc:
                        if self.client.gone or not self._pristine or self.reopen is None:
                            raise
                        await self._retry(exc)
            except BaseException as exc:
                await self._disarm(exc)  # raises TimeoutError if the deadline cancelled the relay
                raise
            else:
                await self._disarm(None)
        except APIError as error:  # the retries after keep-alives are spent
            await self._broken(send, error, started=False)
            return
        except KeptAliveOnly as dropped:
            await self._broken(send, dropped.error, started=False)
            return
        except (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError) as exc:
            if self.client.gone:
                raise ClientGone() from exc
            if not self._final:
                await self._broken(send, map_transport_error(exc))
                return
            if self._open_data:  # the last event lacked only its blank line
                await self._send(send, b"\n", closing=True)
        if not self._closed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self._final:
            self.client.relaying = False  # the client has it all: its going away no longer matters
            await self._drain()

    async def _arm(self) -> None:
        """Before the first wait on DeepSeek: the client is watched and the deadline's scope entered (left by
        `_disarm`) from now on."""
        self._armed = True
        self.client.arm()
        left = max(self.deadline - time.perf_counter(), 0.001)
        timeout = asyncio.timeout_at(asyncio.get_running_loop().time() + left)
        await timeout.__aenter__()
        self._timeout = timeout

    async def _disarm(self, exc: BaseException | None) -> None:
        """Leave the deadline's scope, as `async with` would; its expiry (the relay cancelled) raises
        TimeoutError."""
        timeout, self._timeout = self._timeout, None
        if timeout is not None:
            await timeout.__aexit__(type(exc) if exc is not None else None, exc,
                                    exc.__traceback__ if exc is not None else None)

    async def _retry(self, exc: BaseException) -> None:
        """The upstream failed having sent only keep-alives: relay a new attempt in its place."""
        assert self.reopen is not None
        if not self._armed:
            await self._arm()
        error = exc.error if isinstance(exc, KeptAliveOnly) else map_transport_error(exc)
        await self.resp.aclose()
        if self._partial:  # an unfinished comment line: end it for the meter, drop it for the client
            self.meter.feed(b"\n")
            self._partial = bytearray()
        self.resp = await self.reopen(error)
        if not is_event_stream(self.resp.header("content-type") or ""):
            raise bad_gateway("DeepSeek answered a streaming request with 200 but not an event stream "
                              "(upstream broke the protocol).", "upstream_bad_response")

    async def _drain(self) -> None:
        """Read what follows the last event (the end of the chunked body), briefly: the connection then goes
        back to the pool instead of being closed. A reset or a stall here changes nothing."""
        answer = self.resp
        if answer.at_eof():  # the body has ended already (its connection is pooled)
            return
        try:
            async with asyncio.timeout(DRAIN_S):
                while answer.ready() or await answer.read_chunk():
                    pass
        except (TimeoutError, httpx2.HTTPError, aiohttp.ClientError, OSError, RuntimeError):
            pass

    async def _pump(self, send: Send) -> None:
        answer = self.resp
        while True:  # what has arrived is taken at once: one await per wait on DeepSeek
            raw = answer.ready()
            if not raw:
                if answer.at_eof():
                    break
                if not self._armed:
                    await self._arm()
                raw = await answer.read_chunk()
                if not raw:
                    break
            await self._relay_chunk(send, raw)
            if self._final and self._between:
                return
        if self._pristine and self.reopen is not None:  # ended before its first event: no answer at all
            raise KeptAliveOnly(bad_gateway("DeepSeek ended the stream before its first event (it sent only "
                                            "keep-alives).", "upstream_bad_response"))
        if self._partial:  # the stream ended without a final newline: relay what there is
            await self._send(send, bytes(self._partial))
            self._partial = bytearray()
        if not self.ex.finished:
            # No final event: a stream DeepSeek ended with its own error event is its error, relayed as is.
            self.meter.finish()
            await self._end("upstream_error" if self.meter.ended_with_error else "ok", 200)

    async def _relay_chunk(self, send: Send, raw: bytes) -> None:
        if self._pristine and not only_keepalives(bytes(self._partial) + raw):
            self._pristine = False
        self.ex.stream_bytes += len(raw)
        if self.max_line is not None and len(self._partial) + len(raw) > self.max_line \
                and raw.find(b"\n") < 0:
            raise too_large(self.max_line)  # ends the stream with the family's error event, and a record
        self.meter.feed(raw)
        if self.trace is not None:
            self.trace.feed(raw)
        chunk = self._complete_lines(raw)
        if self.filter is not None:
            chunk = self.filter.feed(chunk)
        if self.end is None and self.meter.final_in(chunk):
            self._final = True
            await self._end("ok", 200)
        if chunk:
            await self._send(send, chunk, closing=self._final)

    def _complete_lines(self, chunk: bytes) -> bytes:
        """Relay whole lines only: if the stream breaks mid-line, the client never gets half an event. A long
        line is gathered in place (joining it anew with each piece took time squared in its length)."""
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            self._partial += chunk
            return b""
        data = bytes(self._partial) + chunk[:cut] if self._partial else chunk[:cut] if cut != len(chunk) \
            else chunk
        self._partial = bytearray(chunk[cut:])
        return data

    async def _send(self, send: Send, chunk: bytes, closing: bool = False) -> None:
        """Relay a chunk; when `closing` (the stream's last event is in it) and it ends that event, it is the
        response's last (uvicorn writes it and the chunked body's end at once)."""
        self._track(chunk)
        last = closing and self._between
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
        except OSError as exc:  # uvicorn: the client disconnected
            raise ClientGone() from exc
        if last:
            self._closed = True
            self.client.relaying = False  # the client has it all: its going away no longer matters

    def _track(self, chunk: bytes) -> None:
        """Note whether the client is now between events (every relayed chunk but a stream's unterminated
        last one ends with a newline, so a blank line may also open the chunk)."""
        lf = chunk.rfind(b"\n\n")
        crlf = chunk.rfind(b"\n\r\n") if b"\r" in chunk else -1  # one byte's search (memchr) first
        if lf >= 0 or crlf >= 0:
            rest = chunk[max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0):]
        elif chunk[:1] == b"\n" or chunk[:2] == b"\r\n":
            rest = chunk[1:] if chunk[:1] == b"\n" else chunk[2:]
        else:
            self._between = self._between and not chunk
            self._open_data = self._open_data or chunk.startswith(b"data:") or b"\ndata:" in chunk
            return
        self._between = not rest
        self._open_data = rest.startswith(b"data:") or b"\ndata:" in rest

    async def _end(self, outcome: str, status: int) -> None:
        """The upstream side has ended so: the meter finishes, the exchange gets its record (`on_end`)."""
        self.end = (outcome, status)
        self.meter.finish()
        await self.on_end(self.ex, self.meter, outcome, status)

    async def _broken(self, send: Send, error: APIError, started: bool = True) -> None:
        """End the stream with the family's error event: the stream broke after it `started`, or (not
        started) no attempt answered before the retries were spent."""
        if started:
            why = ("DeepSeek sent nothing for longer than the upstream timeout" if error.status == 504
                   else "the connection to DeepSeek broke")
            error.message = f"The answer is incomplete: {why} after the stream started. Retry the request."
            error.code = "upstream_stream_broken"
        await self._end("upstream_failed", error.status)
        # End an event the client holds with data lines so ours stands alone; one with no data line yet
        # (only `event:`) takes our lines as its own (the last `event:` line names it), or the SDKs would
        # parse an event without data.
        boundary = b"\n" if self._open_data else b""
        await self._send(send, boundary + self.error_event(error))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
