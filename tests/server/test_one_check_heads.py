"""OneCheckHeads (app/server.py): a response's head checked at once, and header lines rendered by chatgate
written as they come; heads and bodies as uvicorn writes them (compared with uvicorn's own cycle, whatever
`configure` did to the module's name)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from app.gateway.responses import HEAD_BLOCK, response_start
from app.quotas.model import RateInfo
from app.server import OneCheckHeads
from tests.server.test_one_write import Transport

RequestResponseCycle = OneCheckHeads.__mro__[1]  # uvicorn's


class Flow:
    write_paused = False

    async def drain(self) -> None:
        return None


def _cycle(kind: type[Any], method: str = "GET", keep_alive: bool = True,
           access_log: bool = False) -> tuple[Any, Transport]:
    transport = Transport()
    ended: list[bool] = []
    cycle = RequestResponseCycle(
        scope={"method": method, "type": "http", "client": ("127.0.0.1", 1), "path": "/",  # type: ignore[typeddict-item]
               "raw_path": b"/", "query_string": b"", "http_version": "1.1"},
        transport=transport,  # type: ignore[arg-type]
        flow=Flow(),  # type: ignore[arg-type]
        logger=logging.getLogger("test"), access_logger=logging.getLogger("test.access"),
        access_log=access_log, default_headers=[(b"server", b"uvicorn"), (b"date", b"Mon, 07 Dec 2026")],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
        on_response=lambda: ended.append(True))
    cycle.__class__ = kind
    cycle.ended = ended
    return cycle, transport


def _answer(kind: type[Any], *messages: dict[str, Any], **options: Any) -> tuple[Any, ...]:
    """What the cycle wrote, its state after `messages`, and the error that stopped them (if any)."""
    async def run() -> tuple[Any, ...]:
        cycle, transport = _cycle(kind, **options)
        error = None
        try:
            for message in messages:
                await cycle.send(message)
        except RuntimeError as exc:
            error = str(exc)
        state = {k: getattr(cycle, k) for k in ("response_started", "response_complete", "chunked_encoding",
                                                  "expected_content_length", "keep_alive", "ended")}
        return transport.calls, state, cycle.message_event.is_set(), error
    return asyncio.run(run())


HEADS = [
    {"status": 200, "headers": [(b"content-type", b"application/json"), (b"content-length", b"2"),
                                (b"x-ratelimit-limit-requests", b"10000000")]},
    {"status": 200, "headers": [(b"Content-Type", b"text/event-stream"), (b"Transfer-Encoding", b"chunked")]},
    {"status": 200, "headers": [(b"content-type", b"text/event-stream")]},  # chunked by uvicorn
    {"status": 429, "headers": [(b"Connection", b"keep-alive, Close"), (b"content-length", b"0")]},
    {"status": 204, "headers": []},
    {"status": 304, "headers": [(b"etag", b'"x"')]},
    {"status": 503, "headers": [(b"retry-after", b"1"), (b"x-note", b"caf\xc3\xa9\ttab")]},
]
BODIES = [
    [{"type": "http.response.body", "body": b"{}"}],
    [{"type": "http.response.body", "body": b"{", "more_body": True},
     {"type": "http.response.body", "body": b"}"}],
    [{"type": "http.response.body", "body": b"", "more_body": True}, {"type": "http.response.body"}],
    [{"type": "http.response.body", "body": b"far too long for its content-length"}],
    [{"type": "http.response.start", "status": 200}],
    [{"type": "http.response.body", "body": b"{}"}, {"type": "http.response.body", "body": b"late"}],
]


@pytest.mark.parametrize("message", HEADS)
@pytest.mark.parametrize("options", [{}, {"method": "HEAD"}, {"keep_alive": False}])
@pytest.mark.parametrize("bodies", [[], *BODIES])
def test_the_answer_is_uvicorns(message: dict[str, Any], options: dict[str, Any],
                                bodies: list[dict[str, Any]]) -> None:
    start = {"type": "http.response.start", **message}
    ours = _answer(OneCheckHeads, start, *bodies, **options)
    assert ours == _answer(RequestResponseCycle, start, *bodies, **options)
    assert ours[0]  # the head at least


@pytest.mark.parametrize("header, error", [
    ((b"bad name", b"x"), "Invalid HTTP header name."),
    ((b"x-ok", b"line\nbreak"), "Invalid HTTP header value."),
    ((b"x-ok", b"nul\x00"), "Invalid HTTP header value."),
])
def test_an_invalid_header_is_refused_as_uvicorn_refuses_it(header: tuple[bytes, bytes], error: str) -> None:
    message = {"type": "http.response.start", "status": 200, "headers": [(b"x-first", b"1"), header]}
    for kind in (OneCheckHeads, RequestResponseCycle):
        assert _answer(kind, message)[3] == error


def test_a_name_is_checked_once_then_known() -> None:
    OneCheckHeads.valid_names.clear()
    _answer(OneCheckHeads, {"type": "http.response.start", "status": 200, "headers": [(b"x-seen", b"1")]})
    assert b"x-seen" in OneCheckHeads.valid_names
    bad = {"type": "http.response.start", "status": 200, "headers": [(b"bad name", b"")]}
    assert _answer(OneCheckHeads, bad)[3] == "Invalid HTTP header name."
    assert b"bad name" not in OneCheckHeads.valid_names  # a refused name is never kept


def test_what_uvicorn_treats_specially_goes_to_uvicorn() -> None:
    message = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
    assert _answer(OneCheckHeads, message, access_log=True) == _answer(RequestResponseCycle, message,
                                                                      access_log=True)
    body_first = {"type": "http.response.body", "body": b""}
    assert _answer(OneCheckHeads, body_first) == _answer(RequestResponseCycle, body_first)
    error = str(_answer(OneCheckHeads, body_first)[3])
    assert error.startswith("Expected ASGI message 'http.response.start'")


INFOS = [
    RateInfo(100, 99, 59.9, 10**12, 10**12 - 7000, 59.9),  # one subject: one reset for both
    RateInfo(100, 0, 0.0, 5000, -10, 0.25),  # nothing left (never below 0), resets apart
    RateInfo(100, 42, 61.0),  # rpm alone
    RateInfo(limit_tokens=9000, remaining_tokens=8000, reset_tokens=3.5),  # tpm alone
    RateInfo(),  # max_concurrent alone: no headers
]


@pytest.mark.parametrize("info", INFOS)
def test_the_rate_headers_block_is_their_lines(info: RateInfo) -> None:
    assert info.block() == b"".join(b"%s: %s\r\n" % pair for pair in info.headers())


@pytest.mark.parametrize("info", INFOS[:2])
def test_a_block_is_written_as_the_same_head_as_its_headers(info: RateInfo) -> None:
    """The server that takes a block writes the head the pairs would have made."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    with_block = response_start({"extensions": {HEAD_BLOCK: {}}}, 200, headers, info)
    assert with_block["headers"] == headers and with_block[HEAD_BLOCK] == info.block()
    as_pairs = response_start({}, 200, headers, info)  # another ASGI server: the pairs
    assert as_pairs["headers"] == [*headers, *info.headers()] and HEAD_BLOCK not in as_pairs
    body = {"type": "http.response.body", "body": b"{}"}
    assert _answer(OneCheckHeads, with_block, body) == _answer(RequestResponseCycle, as_pairs, body)
    assert response_start({"extensions": {HEAD_BLOCK: {}}}, 200, headers, None) == {
        "type": "http.response.start", "status": 200, "headers": headers}


def test_every_cycle_of_a_configured_server_is_one() -> None:
    from uvicorn.protocols.http import httptools_impl

    from app.server import configure
    from app.settings import ServerSettings

    configure(ServerSettings())
    assert httptools_impl.RequestResponseCycle is OneCheckHeads
