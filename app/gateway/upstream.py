"""The one upstream client: a pooled httpx2 AsyncClient per app, and the mapping of transport errors."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import time
from collections.abc import AsyncIterable

import aiohttp
import httpx2
from httpx_aiohttp.httpx2 import AiohttpTransport
from httpx_aiohttp.httpx2.transport import AiohttpResponseStream, map_aiohttp_exceptions
from yarl import URL

from app.errors import APIError, bad_gateway, gateway_timeout
from app.settings import UpstreamSettings

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding", "content-encoding",
    # uvicorn already answered the client's 100-continue; sent on, aiohttp would hold the body back until
    # DeepSeek sent one too (curl adds it to large POSTs)
    "expect", "proxy-connection",
})


@functools.cache
def _ssl_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx2's default context (the system's CAs, or SSL_CERT_FILE / SSL_CERT_DIR, passed here so that a
    change of them is a new context), built once per process: loading the CAs costs ~30 ms of CPU, paid by
    every app a process creates (the tests start hundreds)."""
    return httpx2.create_ssl_context()


def build_transport(settings: UpstreamSettings) -> httpx2.AsyncBaseTransport:
    limits = httpx2.Limits(max_connections=settings.max_connections,
                           max_keepalive_connections=settings.max_connections, keepalive_expiry=30)
    ssl_context = _ssl_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if settings.transport == "aiohttp":
        return AiohttpTransport(verify=ssl_context, limits=limits)
    return httpx2.AsyncHTTPTransport(verify=ssl_context, limits=limits)


class Upstream:
    """httpx2's request and response types over a pooled transport, called directly.

    The client's redirect, auth and cookie layers are of no use to a proxy and cost ~60 µs a request;
    timeouts go to the transport through the request's `timeout` extension, as httpx2's client does.
    """

    def __init__(self, settings: UpstreamSettings,
                 transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.base_url = settings.base_url
        timeout = httpx2.Timeout(settings.read_timeout, connect=settings.connect_timeout,
                                 pool=settings.connect_timeout)
        self._extensions = {"timeout": timeout.as_dict()}
        self.transport = transport or build_transport(settings)
        self._urls: dict[str, httpx2.URL] = {}
        # The default transport is driven directly: its ClientSession gets the request as aiohttp takes it,
        # without an httpx2.Request built to be taken apart again (~80K instructions a request). An injected
        # transport (the tests' MockTransport, httpx2's own) gets the httpx2.Request.
        self._direct = type(self.transport) is AiohttpTransport
        self._aiohttp_timeout = aiohttp.ClientTimeout(sock_connect=settings.connect_timeout,
                                                      sock_read=settings.read_timeout,
                                                      connect=settings.connect_timeout)
        self._yarl: dict[httpx2.URL, URL] = {}
        self._stand_ins: dict[tuple[str, httpx2.URL], httpx2.Request] = {}

    async def aclose(self) -> None:
        await self.transport.aclose()

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
                   body: bytes | AsyncIterable[bytes] | None) -> httpx2.Response:
        """Send and return once the headers are in; the body is read by the caller (streamed). `target` is a
        route's path, or a URL from `url_of`; an iterable body is streamed (chunked, unless the headers give
        its Content-Length)."""
        url = self.url(target) if isinstance(target, str) else target
        if self._direct and (body is None or isinstance(body, bytes)):
            return await self._send_direct(method, url, headers, body, isinstance(target, str))
        request = httpx2.Request(method, url, headers=headers, content=body, extensions=self._extensions)
        try:
            return await self.transport.handle_async_request(request)
        except (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError) as exc:
            raise map_transport_error(exc) from None

    async def _send_direct(self, method: str, url: httpx2.URL,
                           headers: list[tuple[str, str]] | list[tuple[bytes, bytes]],
                           body: bytes | None, cache: bool) -> httpx2.Response:
        transport = self.transport
        assert isinstance(transport, AiohttpTransport)
        session = transport.client
        if not isinstance(session, aiohttp.ClientSession):
            session = transport.client = transport.get_client()
        target = self._yarl.get(url)
        if target is None:
            target = URL(str(url))
            if cache:  # a route's path; a URL with an id or a query is made per request
                self._yarl[url] = target
        pairs: list[tuple[str, str]] = [
            (k.decode("latin-1"), _header_text(v)) if isinstance(k, bytes) and isinstance(v, bytes)
            else (str(k), str(v)) for k, v in headers]
        try:
            with map_aiohttp_exceptions():
                response = await session.request(
                    method, target, headers=pairs, data=body or None, allow_redirects=False,
                    auto_decompress=False, compress=False, timeout=self._aiohttp_timeout)
        except (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError) as exc:
            raise map_transport_error(exc) from None
        stand_in = self._stand_ins.get((method, url))
        if stand_in is None:  # the response's `request`, which nothing here reads: one per route and method
            stand_in = httpx2.Request(method, url)
            if cache:
                self._stand_ins[(method, url)] = stand_in
        extensions: dict[str, object] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx2.Response(response.status, headers=response.raw_headers,
                               stream=AiohttpResponseStream(response), request=stand_in,
                               extensions=extensions)

    async def fetch(self, method: str, target: str | httpx2.URL,
                    headers: list[tuple[str, str]] | list[tuple[bytes, bytes]], deadline: float
                    ) -> tuple[httpx2.Response, bytes]:
        """A bodiless request's answer and its whole body, both by `deadline` (time.perf_counter); the
        APIError (502, 504) when DeepSeek cannot be reached, breaks off or does not answer in time."""
        try:
            async with asyncio.timeout(_left(deadline)):
                resp = await self.send(method, target, headers, None)
        except TimeoutError as exc:
            raise map_transport_error(exc) from None
        return resp, await read_whole(resp, deadline)


async def read_all(resp: httpx2.Response, limit: int | None = None) -> bytes:
    """The body as sent; decoded only if DeepSeek compressed it although chatgate asked for identity. Over
    `limit` bytes: the APIError of `too_large` (nothing more is read)."""
    try:
        content = resp.content  # a transport that answers with the body already read (MockTransport)
    except httpx2.ResponseNotRead:
        pass
    else:
        if limit is not None and len(content) > limit:
            raise too_large(limit)
        return content
    chunks, size = [], 0
    pieces = resp.aiter_bytes() if "content-encoding" in resp.headers else resp.aiter_raw()
    async for chunk in pieces:
        size += len(chunk)
        if limit is not None and size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(limit: int) -> APIError:
    return bad_gateway(f"DeepSeek's answer is larger than limits.max_upstream_bytes ({limit} bytes at once): "
                       "chatgate does not hold it.", "upstream_too_large")


async def read_whole(resp: httpx2.Response, deadline: float, limit: int | None = None) -> bytes:
    """The whole body by `deadline` (time.perf_counter), then the response closed; the APIError (502, 504)
    when it breaks off, stalls, cannot be decoded or is over `limit` bytes."""
    try:
        async with asyncio.timeout(_left(deadline)):
            return await read_all(resp, limit)
    except httpx2.DecodingError:
        raise bad_gateway("DeepSeek sent a compressed body that could not be decoded (upstream broke the "
                          "protocol).", "upstream_bad_response") from None
    except (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError) as exc:
        raise map_transport_error(exc) from None
    finally:
        await resp.aclose()


def _header_text(value: bytes) -> str:
    """A header value as aiohttp takes it (it writes str values as UTF-8): UTF-8 bytes pass unchanged,
    obs-text that is not UTF-8 goes as its latin-1 reading, as through httpx2's Headers."""
    if value.isascii():
        return value.decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def aiohttp_reader(resp: httpx2.Response) -> aiohttp.StreamReader | None:
    """The aiohttp body reader under httpx-aiohttp's response stream, when that is the transport."""
    content = getattr(getattr(resp.stream, "_aiohttp_response", None), "content", None)
    return content if isinstance(content, aiohttp.StreamReader) else None


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
            return False  # httpx-aiohttp reports every aiohttp connection error as a ConnectTimeout
    return isinstance(exc, httpx2.TimeoutException)


def _hop_by_hop(raw: list[tuple[bytes, bytes]], fixed: frozenset[str] = HOP_BY_HOP) -> frozenset[str]:
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


def response_headers(headers: httpx2.Headers, request_id: str) -> list[tuple[bytes, bytes]]:
    drop = _hop_by_hop(headers.raw, NOT_RELAYED)
    out = [(k, v) for k, v in headers.raw if k.decode("latin-1").lower() not in drop]
    out.append((b"x-request-id", request_id.encode("latin-1")))
    return out
