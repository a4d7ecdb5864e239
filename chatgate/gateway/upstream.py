"""The one upstream client: an `Answer` interface of chatgate's own (status, headers, read a chunk, close)
over aiohttp in production and over any httpx2 transport (the tests' MockTransport and ASGITransport,
httpx2's own when upstream.transport = "httpx"), and the mapping of transport errors. The relay and the
retrier read every answer through `Answer`: one path, whichever client made it."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Protocol

import aiohttp
import httpx2
from yarl import URL

from chatgate.errors import APIError, bad_gateway, gateway_timeout
from chatgate.settings import UpstreamSettings

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding", "content-encoding",
    # uvicorn already answered the client's 100-continue; sent on, aiohttp would hold the body back until
    # DeepSeek sent one too (curl adds it to large POSTs)
    "expect", "proxy-connection",
})
TRANSPORT_ERRORS = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError)
Headers = Sequence[tuple[bytes, bytes]]


class Answer(Protocol):
    """DeepSeek's answer once its headers are in: its status and headers, then its body a chunk at a time."""

    @property
    def status_code(self) -> int: ...

    @property
    def raw_headers(self) -> Headers: ...

    def header(self, name: str) -> str | None:
        """A header's value (the first of that name, any case); None if it was not sent."""

    def ready(self) -> bytes:
        """What of the body has arrived, without waiting (b"": nothing yet, or the body has ended)."""

    def at_eof(self) -> bool:
        """Whether the body has ended and all of it was read."""

    async def read_chunk(self) -> bytes:
        """The next piece of the body, waiting for it; b"" at its end. Raises a transport error when the
        body breaks off."""

    async def aclose(self) -> None:
        """Let go of the answer (its connection back to the pool if it was read to its end)."""


class AiohttpAnswer:
    """An answer read from aiohttp's response (production)."""

    __slots__ = ("_closed", "_content", "_response", "raw_headers", "status_code")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._content = response.content
        self._closed = False
        self.status_code = response.status
        self.raw_headers = response.raw_headers

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    def ready(self) -> bytes:
        return self._content.read_nowait()

    def at_eof(self) -> bool:
        return self._content.is_eof()

    async def read_chunk(self) -> bytes:
        return await self._content.readany()

    async def aclose(self) -> None:
        if not self._closed:  # what `async with response` does on leaving
            self._closed = True
            self._response.release()
            await self._response.wait_for_close()


class TransportAnswer:
    """An answer from an httpx2 transport (`handle_async_request`'s response, its body not read yet, or
    read already: a MockTransport's)."""

    __slots__ = ("_chunks", "_eof", "_response", "_whole", "raw_headers", "status_code")

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.raw_headers = response.headers.raw
        self._chunks: AsyncIterator[bytes] | None = None
        self._eof = False
        try:
            self._whole: bytes | None = response.content
        except httpx2.ResponseNotRead:
            self._whole = None

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    def ready(self) -> bytes:
        whole, self._whole = self._whole, None
        if whole is not None:
            self._eof = True
            return whole
        return b""

    def at_eof(self) -> bool:
        return self._eof

    async def read_chunk(self) -> bytes:
        if self._eof:
            return b""
        if self._whole is not None:
            return self.ready()
        if self._chunks is None:
            self._chunks = self._response.aiter_raw().__aiter__()
        async for chunk in self._chunks:
            if chunk:
                return chunk
        self._eof = True
        return b""

    async def aclose(self) -> None:
        await self._response.aclose()


class ReadAnswer:
    """An answer read whole (an error the retrier read, or one it made): its body is `content`."""

    __slots__ = ("_eof", "content", "raw_headers", "status_code")

    def __init__(self, status_code: int, raw_headers: Headers, content: bytes) -> None:
        self.status_code, self.raw_headers, self.content = status_code, raw_headers, content
        self._eof = False

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        return next((v.decode("latin-1") for k, v in self.raw_headers if k.lower() == wanted), None)

    def ready(self) -> bytes:
        if self._eof:
            return b""
        self._eof = True
        return self.content

    def at_eof(self) -> bool:
        return self._eof

    async def read_chunk(self) -> bytes:
        return self.ready()

    async def aclose(self) -> None:
        self._eof = True


@functools.cache
def _ssl_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx2's default context (the system's CAs, or SSL_CERT_FILE / SSL_CERT_DIR, passed here so that a
    change of them is a new context), built once per process: loading the CAs is paid once, not by every
    app a process creates (the tests start hundreds)."""
    return httpx2.create_ssl_context()


def ssl_context() -> ssl.SSLContext:
    return _ssl_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


class Upstream:
    """Sends a request to DeepSeek and hands back its `Answer` once the headers are in: through a pooled
    aiohttp session (upstream.transport = "aiohttp", the default), else through an httpx2 transport (the
    one given, or httpx2's own). The client layers of either (redirects, cookies, auth) are of no use to a
    proxy and are not used; timeouts are the transport's (connect, and each read)."""

    def __init__(self, settings: UpstreamSettings,
                 transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.base_url = settings.base_url
        if transport is None and settings.transport == "httpx":
            limits = httpx2.Limits(max_connections=settings.max_connections,
                                   max_keepalive_connections=settings.max_connections, keepalive_expiry=30)
            transport = httpx2.AsyncHTTPTransport(verify=ssl_context(), limits=limits)
        self.transport = transport  # None: aiohttp's session
        timeout = httpx2.Timeout(settings.read_timeout, connect=settings.connect_timeout,
                                 pool=settings.connect_timeout)
        self._extensions = {"timeout": timeout.as_dict()}
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, httpx2.URL] = {}
        self._yarl: dict[str, URL] = {}

    async def aclose(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()
        if self._session is not None:
            await self._session.close()

    def url(self, path: str) -> httpx2.URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx2.URL(self.base_url + path)
        return url

    def url_of(self, path: str, query: str = "") -> httpx2.URL:
        """The URL of a path that holds an id, or of a query: built each time (`url` caches by path)."""
        return httpx2.URL(self.base_url + path + ("?" + query if query else ""))

    async def send(self, method: str, target: str | httpx2.URL,
                   headers: list[tuple[str, str]] | list[tuple[bytes, bytes]],
                   body: bytes | AsyncIterable[bytes] | None) -> Answer:
        """Send and return once the headers are in; the body is read by the caller (streamed). `target` is a
        route's path, or a URL from `url_of`; an iterable body is streamed (chunked, unless the headers give
        its Content-Length). Raises the APIError (502, 504) of an unreachable DeepSeek."""
        try:
            if self.transport is None:
                return await self._send_aiohttp(method, target, headers, body)
            url = self.url(target) if isinstance(target, str) else target
            request = httpx2.Request(method, url, headers=headers, content=body, extensions=self._extensions)
            return TransportAnswer(await self.transport.handle_async_request(request))
        except TRANSPORT_ERRORS as exc:
            raise map_transport_error(exc) from None

    async def _send_aiohttp(self, method: str, target: str | httpx2.URL,
                            headers: list[tuple[str, str]] | list[tuple[bytes, bytes]],
                            body: bytes | AsyncIterable[bytes] | None) -> Answer:
        session = self._session
        if session is None:
            session = self._session = self._new_session()
        if isinstance(target, str):  # a route's path; a URL with an id or a query is made per request
            url = self._yarl.get(target)
            if url is None:
                url = self._yarl[target] = URL(self.base_url + target)
        else:
            url = URL(str(target))
        pairs: list[tuple[str, str]] = [
            (k.decode("latin-1"), _header_text(v)) if isinstance(k, bytes) and isinstance(v, bytes)
            else (str(k), str(v)) for k, v in headers]
        response = await session.request(method, url, headers=pairs, data=body or None, allow_redirects=False)
        return AiohttpAnswer(response)

    def _new_session(self) -> aiohttp.ClientSession:
        s = self.settings
        connector = aiohttp.TCPConnector(limit=s.max_connections, keepalive_timeout=30, ssl=ssl_context())
        timeout = aiohttp.ClientTimeout(sock_connect=s.connect_timeout, sock_read=s.read_timeout,
                                        connect=s.connect_timeout)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                     cookie_jar=aiohttp.DummyCookieJar())

    async def fetch(self, method: str, target: str | httpx2.URL,
                    headers: list[tuple[str, str]] | list[tuple[bytes, bytes]], deadline: float
                    ) -> tuple[Answer, bytes]:
        """A bodiless request's answer and its whole body, both by `deadline` (time.perf_counter); the
        APIError (502, 504) when DeepSeek cannot be reached, breaks off or does not answer in time."""
        try:
            async with asyncio.timeout(_left(deadline)):
                answer = await self.send(method, target, headers, None)
        except TimeoutError as exc:
            raise map_transport_error(exc) from None
        return answer, await read_whole(answer, deadline)


class KeptAliveOnly(Exception):
    """The upstream failed after only keep-alives: nothing of the answer was received, a retry may follow."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def too_large(limit: int) -> APIError:
    return bad_gateway(f"DeepSeek's answer is larger than limits.max_upstream_bytes ({limit} bytes at once): "
                       "chatgate does not hold it.", "upstream_too_large")


async def read_whole(answer: Answer, deadline: float, limit: int | None = None, retryable: bool = False
                     ) -> bytes:
    """The whole body by `deadline` (time.perf_counter), then the answer closed; decoded only if DeepSeek
    compressed it although chatgate asked for identity. The APIError (502, 504) when it breaks off, stalls,
    cannot be decoded or is over `limit` bytes; when `retryable`, a failure after nothing but blank lines
    (DeepSeek's keep-alives for a queued request) raises KeptAliveOnly instead."""
    if isinstance(answer, ReadAnswer):
        return answer.content
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(_left(deadline)):
            async for chunk in raw_chunks(answer):
                chunks.append(chunk)
                size += len(chunk)
                if limit is not None and size > limit:
                    raise too_large(limit)
    except TRANSPORT_ERRORS as exc:
        error = map_transport_error(exc)
        if retryable and all(not c.strip() for c in chunks):
            raise KeptAliveOnly(error) from None
        raise error from None
    finally:
        await answer.aclose()
    content = b"".join(chunks)
    if (encoding := answer.header("content-encoding")) is not None:
        return _decoded(content, encoding, limit)
    if retryable and not content.strip():  # the connection closed after only keep-alives: no answer at all
        raise KeptAliveOnly(APIError(502, "DeepSeek closed the connection before answering (it sent only "
                                     "keep-alives).", "server_error", None, "upstream_bad_response"))
    return content


def _decoded(content: bytes, encoding: str, limit: int | None) -> bytes:
    """A body DeepSeek compressed although asked for identity, decoded by httpx2's decoders."""
    try:
        decoded = httpx2.Response(200, headers=[("content-encoding", encoding)], content=content).content
    except httpx2.DecodingError:
        raise bad_gateway("DeepSeek sent a compressed body that could not be decoded (upstream broke the "
                          "protocol).", "upstream_bad_response") from None
    if limit is not None and len(decoded) > limit:
        raise too_large(limit)
    return decoded


class _AnswerStream(httpx2.AsyncByteStream):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in raw_chunks(self.answer):
            yield chunk

    async def aclose(self) -> None:
        await self.answer.aclose()


async def next_chunk(answer: Answer, deadline: float | None = None) -> bytes:
    """What of the body has arrived, else its next piece waited for (until `deadline`, time.perf_counter,
    when given: then TimeoutError); b"" at its end."""
    chunk = answer.ready()
    if chunk or answer.at_eof():
        return chunk
    if deadline is None:
        return await answer.read_chunk()
    async with asyncio.timeout(_left(deadline)):
        return await answer.read_chunk()


async def raw_chunks(answer: Answer) -> AsyncIterator[bytes]:
    """The body as it arrives, as sent."""
    while chunk := await next_chunk(answer):
        yield chunk


async def body_chunks(answer: Answer) -> AsyncIterator[bytes]:
    """The body as it arrives; decoded (by httpx2's decoders) if DeepSeek compressed it."""
    if answer.header("content-encoding") is not None:
        response = httpx2.Response(answer.status_code, headers=list(answer.raw_headers),
                                   stream=_AnswerStream(answer))
        async for chunk in response.aiter_bytes():
            yield chunk
        return
    async for chunk in raw_chunks(answer):
        yield chunk


def _header_text(value: bytes) -> str:
    """A header value as aiohttp takes it (it writes str values as UTF-8): UTF-8 bytes pass unchanged,
    obs-text that is not UTF-8 goes as its latin-1 reading, as through httpx2's Headers."""
    if value.isascii():
        return value.decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.001)


def map_transport_error(exc: BaseException) -> APIError:
    """Unreachable or broken upstream -> 502; no answer in time -> 504. Never leaks a key or a path."""
    if is_timeout(exc):
        return gateway_timeout("DeepSeek did not answer in time (upstream timeout). Retry later, or raise "
                               "upstream.read_timeout for long reasoning requests.")
    cause = exc.__cause__ or exc
    return bad_gateway(f"Could not reach DeepSeek (upstream unreachable: {type(cause).__name__}). Check "
                       "upstream.base_url and the network.")


def is_timeout(exc: BaseException) -> bool:
    for err in (exc, exc.__cause__):
        if isinstance(err, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return True
        if isinstance(err, aiohttp.ClientError):
            return False  # a refused or reset connection, not a timeout
    return isinstance(exc, httpx2.TimeoutException)


def _hop_by_hop(raw: Headers, fixed: frozenset[str] = HOP_BY_HOP) -> frozenset[str]:
    """The fixed hop-by-hop set plus every header named by the message's `Connection` (RFC 9110 7.6.1)."""
    named = {token.strip().lower() for k, v in raw if k.lower() == b"connection"
             for token in v.decode("latin-1").split(",") if token.strip()}
    return fixed | named if named else fixed


NOT_FORWARDED = HOP_BY_HOP | {"authorization", "x-request-id"}
# managed mode: the client's key is chatgate's, never DeepSeek's: whichever header carries it stays here
NOT_FORWARDED_MANAGED = NOT_FORWARDED | {"x-api-key", "api-key"}  # api-key: Azure-style SDKs


def forward_headers(raw: list[tuple[bytes, bytes]], authorization: str | None, request_id: str,
                    managed: bool = False) -> list[tuple[bytes, bytes]]:
    """The client's headers as raw bytes, minus hop-by-hop ones. (The aiohttp transport writes header values
    as UTF-8: UTF-8 values pass unchanged, obs-text that is not UTF-8 goes as its latin-1 reading.)"""
    drop = _hop_by_hop(raw, NOT_FORWARDED_MANAGED if managed else NOT_FORWARDED)
    out = [(k, v) for k, v in raw if k.decode("latin-1").lower() not in drop]
    if authorization:
        out.append((b"authorization", authorization.encode("latin-1", "replace")))
    out.append((b"x-request-id", request_id.encode("latin-1", "replace")))
    out.append((b"accept-encoding", b"identity"))
    return out


# uvicorn adds its own Date and Server: relaying DeepSeek's too would send each header twice.
OWN_RESPONSE_HEADERS = frozenset({"x-request-id", "date", "server"})
NOT_RELAYED = HOP_BY_HOP | OWN_RESPONSE_HEADERS


def response_headers(raw: Headers, request_id: str) -> list[tuple[bytes, bytes]]:
    drop = _hop_by_hop(raw, NOT_RELAYED)
    out = [(k, v) for k, v in raw if k.decode("latin-1").lower() not in drop]
    out.append((b"x-request-id", request_id.encode("latin-1")))
    return out
