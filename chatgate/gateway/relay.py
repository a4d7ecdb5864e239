"""Relaying an upstream SSE stream to the client chunk by chunk, as it arrives.

The gateway's event generator (`Gateway._events`, chatgate/gateway/proxy.py) reads DeepSeek's answer, frames
it here (`EventFramer`: whole lines only, the family's meter and chunk filter fed, the stream's last event
found, an error event that stands alone) and yields the pieces the client gets; it makes the usage record
when DeepSeek's side ends, before the last event is yielded, or in its `finally` when the client went away
first. `Relayed` is the ASGI response that sends those pieces, as Starlette's StreamingResponse sends its
iterator (a tool API's answer too: chatgate/gateway/proxy.py `_tool_pieces`), with two differences the hot
path wants: the piece that ends the last event goes with `more_body: False` (one write with the chunked body's
end), and the client's disconnect is watched only from the first wait on DeepSeek on (the generator yields
`WAIT` before it): a stream received whole is relayed without a watcher task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx2
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from chatgate.errors import APIError
from chatgate.gateway.family import ChunkFilter, StreamMeter
from chatgate.gateway.responses import HeadLines, response_start
from chatgate.gateway.retry import only_keepalives
from chatgate.gateway.upstream import Answer, KeptAliveOnly, next_chunk, too_large
from chatgate.gateway.watch import ClientGone, ClientWatch
from chatgate.tracing.spans import ExchangeTrace

# A piece of the answer for the client, and whether it ends the response (it holds the end of the last event)
Piece = tuple[bytes, bool]
WAIT: Piece = (b"", False)  # the generator is about to wait on DeepSeek: the client is watched from now on
UPSTREAM_FAILURES = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError, KeptAliveOnly)
TRANSPORT_FAILURES = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError)
ErrorEvent = Callable[[APIError], bytes]  # the family's error event (Family.stream_error)
log = logging.getLogger("chatgate")
DRAIN_S = 1.0  # how long the relay waits for the end of the upstream body once the client has the answer
# how long past the request's deadline a client that stopped reading may keep its relay (and its record) open
SLOW_CLIENT_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class Head:
    """A response's status and headers."""

    status: int
    headers: list[tuple[bytes, bytes]]


class Relayed(Response):
    """The client's side of a relayed answer: sends the pieces of `pieces` as they come. `pieces` is the
    gateway's generator, closed here whatever happens (its `finally` makes the record if nothing did). The
    response's head is `head`, or the first `Head` the generator yields (a tool API's answer, whose status is
    known only when its first keep-alive or its end arrives). The client is watched from the generator's
    first `WAIT` on when `lazy`, else from the start. `deadline` (the event loop's clock): a client that has
    not taken everything by then is given up on, so that one that stops reading cannot hold the relay,
    DeepSeek's connection and the request's record open (the generator's `finally` records it as gone)."""

    def __init__(self, pieces: AsyncGenerator[Head | Piece, None], head: Head | None, lines: HeadLines | None,
                 lazy: bool = True, deadline: float | None = None) -> None:
        # Starlette's Response fields, set as its __init__ would
        self.status_code = head.status if head is not None else 200
        self.background = None
        self.body = b""
        self.raw_headers = head.headers if head is not None else []
        self.head = head
        self.pieces = pieces
        self.lines = lines
        self.lazy = lazy
        self.deadline = deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = ClientWatch()
        try:
            async with client.watching(receive, lazy=self.lazy), asyncio.timeout_at(self.deadline):
                if self.head is not None:
                    await _send(send, response_start(self.head.status, self.head.headers, self.lines))
                closed = False
                async for piece in self.pieces:
                    if piece is WAIT:
                        client.arm()
                    elif isinstance(piece, Head):
                        await _send(send, response_start(piece.status, piece.headers, self.lines))
                    else:
                        body, last = piece
                        await _send(send, {"type": "http.response.body", "body": body, "more_body": not last})
                        if last:
                            closed = True
                            client.relaying = False  # the client has it all: its going away no longer matters
                if not closed:
                    await _send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:  # the client stopped reading; the server closes the connection
            log.info("relay: a client that stopped reading was given up on past the request's deadline")
        finally:
            await self.pieces.aclose()


async def drain(answer: Answer) -> None:
    """Read what follows the last event (the end of the chunked body), briefly: the connection then goes back
    to the pool instead of being closed. A reset or a stall here changes nothing."""
    if answer.at_eof():  # the body has ended already (its connection is pooled)
        return
    try:
        async with asyncio.timeout(DRAIN_S):
            while await next_chunk(answer):
                pass
    except (*TRANSPORT_FAILURES, httpx2.HTTPError, RuntimeError):
        pass


async def _send(send: Send, message: dict[str, Any]) -> None:
    try:
        await send(message)
    except OSError as exc:  # uvicorn: the client disconnected
        raise ClientGone() from exc


class EventFramer:
    """What of DeepSeek's stream the client gets: whole lines only (if the stream breaks mid-line, the
    client never gets half an event), filtered by the family's chunk filter; the meter and the trace see
    every byte. `final`: the meter saw the stream's last event; `pristine`: nothing but keep-alive comments
    came yet (a failure may then be retried on the same client response)."""

    def __init__(self, meter: StreamMeter, error_event: ErrorEvent, chunk_filter: ChunkFilter | None,
                 trace: ExchangeTrace | None, max_line: int | None) -> None:
        self.meter = meter
        self.error_event = error_event
        self.filter = chunk_filter
        self.trace = trace
        self.max_line = max_line  # the longest line held (limits.max_upstream_bytes); longer ends the stream
        self.final = False
        self.pristine = True
        self._partial = bytearray()  # an incomplete last line, held back until its newline arrives
        # Where the client is in the event stream: between events, or inside one that has a data line yet
        self.between = True
        self.open_data = False

    def feed(self, raw: bytes) -> bytes:
        """The whole lines `raw` completes, for the client; `too_large`'s APIError for a line too long."""
        if self.pristine and not only_keepalives(bytes(self._partial) + raw):
            self.pristine = False
        if self.max_line is not None and len(self._partial) + len(raw) > self.max_line \
                and raw.find(b"\n") < 0:
            raise too_large(self.max_line)  # ends the stream with the family's error event, and a record
        self.meter.feed(raw)
        if self.trace is not None:
            self.trace.feed(raw)
        chunk = self._complete_lines(raw)
        if self.filter is not None:
            chunk = self.filter.feed(chunk)
        if not self.final and self.meter.final_in(chunk):
            self.final = True
        return chunk

    def piece(self, chunk: bytes) -> Piece:
        """`chunk` as the client gets it: the response's last piece when it ends the stream's last event."""
        self._track(chunk)
        return chunk, self.final and self.between

    def rest(self) -> bytes:
        """The stream ended without a final newline: what there is of its last line."""
        rest, self._partial = bytes(self._partial), bytearray()
        return rest

    def restart(self) -> None:
        """A new attempt's stream follows: an unfinished comment line is ended for the meter, dropped for
        the client."""
        if self._partial:
            self.meter.feed(b"\n")
            self._partial = bytearray()

    def error_piece(self, error: APIError, started: bool) -> bytes:
        """The family's error event that ends the stream: it broke after it `started`, or (not started) no
        attempt answered before the retries were spent. It ends an event the client holds with data lines
        so that it stands alone; one with no data line yet (only `event:`) takes its lines as its own (the
        last `event:` line names it), or the SDKs would parse an event without data."""
        if started:
            why = ("DeepSeek sent nothing for longer than the upstream timeout" if error.status == 504
                   else "the connection to DeepSeek broke")
            error.message = f"The answer is incomplete: {why} after the stream started. Retry the request."
            error.code = "upstream_stream_broken"
        event = (b"\n" if self.open_data else b"") + self.error_event(error)
        self._track(event)
        return event

    def _complete_lines(self, chunk: bytes) -> bytes:
        """Whole lines only. A long line is gathered in place (joining it anew with each piece took time
        squared in its length)."""
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            self._partial += chunk
            return b""
        data = bytes(self._partial) + chunk[:cut] if self._partial else chunk[:cut] if cut != len(chunk) \
            else chunk
        self._partial = bytearray(chunk[cut:])
        return data

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
            self.between = self.between and not chunk
            self.open_data = self.open_data or chunk.startswith(b"data:") or b"\ndata:" in chunk
            return
        self.between = not rest
        self.open_data = rest.startswith(b"data:") or b"\ndata:" in rest
