"""Size limits: limits.max_header_bytes (431, enforced by the pure-ASGI chatgate/gateway/http_limits.py before
any route runs) and limits.max_body_bytes (413, with a Content-Length and with chunked transfer encoding),
on a real chatgate."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import orjson
import pytest

from chatgate.gateway.http_limits import LimitsMiddleware, header_bytes
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate

MAX_HEADERS = 4096
MAX_BODY = 64 * 1024
CHAT = "/v1/chat/completions"
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-limits-test"}
QUESTION = {"model": "deepseek-chat",
            "messages": [{"role": "user", "content": "Summarise our Q3 churn numbers."}]}


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture(scope="module")
def gate(fake: RunningFake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningChatgate]:
    settings = make_settings(tmp_path_factory.mktemp("limits"), fake.url,
                             limits={"max_header_bytes": MAX_HEADERS, "max_body_bytes": MAX_BODY})
    with run_chatgate(settings) as running:
        yield running


def assert_openai_error(resp: httpx2.Response, status: int, code: str, setting: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["param"] is None
    assert setting in error["message"]


def test_middleware_is_pure_asgi_not_base_http_middleware(gate: RunningChatgate) -> None:
    """BaseHTTPMiddleware would wrap every response in its own streaming machinery; LimitsMiddleware is raw
    ASGI and sits in the app's middleware stack."""
    from starlette.middleware.base import BaseHTTPMiddleware

    classes = [m.cls for m in gate.app.user_middleware]
    assert LimitsMiddleware in classes
    assert not any(isinstance(c, type) and issubclass(c, BaseHTTPMiddleware) for c in classes)


def test_header_bytes_counts_name_value_and_separators() -> None:
    assert header_bytes([(b"host", b"x"), (b"a", b"bc")]) == (4 + 1 + 4) + (1 + 2 + 4)


def test_one_huge_header_is_431(gate: RunningChatgate) -> None:
    headers = {**HEADERS, "x-trace-context": "t" * (MAX_HEADERS + 1)}
    resp = httpx2.post(gate.url + CHAT, content=orjson.dumps(QUESTION), headers=headers)
    assert_openai_error(resp, 431, "request_headers_too_large", "limits.max_header_bytes")


def test_many_small_headers_adding_up_is_431(gate: RunningChatgate) -> None:
    headers = {**HEADERS, **{f"x-tag-{i}": "v" * 40 for i in range(100)}}  # ~5 KB in total, each one small
    resp = httpx2.post(gate.url + CHAT, content=orjson.dumps(QUESTION), headers=headers)
    assert_openai_error(resp, 431, "request_headers_too_large", "limits.max_header_bytes")


def test_431_applies_before_auth_and_routing(gate: RunningChatgate) -> None:
    """Even unknown routes and admin routes are refused for oversize headers, before anything else runs."""
    big = {"x-junk": "j" * MAX_HEADERS}
    for method, path in (("GET", "/admin/usage"), ("GET", "/nope"), ("GET", "/v1/models")):
        resp = httpx2.request(method, gate.url + path, headers=big)
        assert_openai_error(resp, 431, "request_headers_too_large", "limits.max_header_bytes")


def test_headers_just_under_the_limit_pass(gate: RunningChatgate, fake: RunningFake) -> None:
    headers = {**HEADERS, "x-trace-context": "t" * (MAX_HEADERS - 600)}
    resp = httpx2.post(gate.url + CHAT, content=orjson.dumps(QUESTION), headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]


def test_streaming_still_streams_through_the_middleware(gate: RunningChatgate) -> None:
    """The middleware must not buffer: a paced SSE answer arrives as several chunks ending with [DONE]."""
    body = orjson.dumps({**QUESTION, "stream": True})
    paced = {**HEADERS, "x-fake-chunk-delay": "0.05"}
    with httpx2.stream("POST", gate.url + CHAT, content=body, headers=paced) as resp:
        assert resp.status_code == 200
        chunks = list(resp.iter_raw())
    assert len(chunks) > 1
    assert b"data: [DONE]" in b"".join(chunks)


def test_body_over_limit_with_content_length_is_413(gate: RunningChatgate, fake: RunningFake) -> None:
    before = len(fake.state.requests)
    big = {**QUESTION, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    resp = httpx2.post(gate.url + CHAT, content=orjson.dumps(big), headers=HEADERS)
    assert "content-length" in {k.lower() for k in resp.request.headers}
    assert_openai_error(resp, 413, "request_too_large", str(MAX_BODY))
    assert len(fake.state.requests) == before, "an oversize body was forwarded"


def test_body_over_limit_chunked_is_413(gate: RunningChatgate, fake: RunningFake) -> None:
    """No Content-Length to trust: chatgate counts while reading and stops at the limit."""
    before = len(fake.state.requests)
    payload = orjson.dumps({**QUESTION, "messages": [{"role": "user", "content": "x" * (2 * MAX_BODY)}]})

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 8192):
            yield payload[i:i + 8192]

    resp = httpx2.post(gate.url + CHAT, content=chunks(), headers=HEADERS)
    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in resp.request.headers
    assert_openai_error(resp, 413, "request_too_large", str(MAX_BODY))
    assert len(fake.state.requests) == before, "an oversize body was forwarded"


def test_chunked_body_under_limit_is_forwarded(gate: RunningChatgate, fake: RunningFake) -> None:
    payload = orjson.dumps(QUESTION)
    before = len(fake.state.requests)
    resp = httpx2.post(gate.url + CHAT, content=iter([payload[:10], payload[10:]]), headers=HEADERS)
    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert resp.status_code == 200, resp.text
    assert [r.body for r in fake.state.requests[before:]] == [payload], "reassembled byte for byte"


def test_validate_route_applies_the_body_limit_to_chunked_bodies(gate: RunningChatgate) -> None:
    """The validate-only route applies the same limit; a chunked oversize body there is a 413 too."""
    payload = b'{"model":"deepseek-chat","messages":[{"role":"user","content":"' + b"y" * MAX_BODY + b'"}]}'
    resp = httpx2.post(gate.url + CHAT + "/validate", content=iter([payload]), headers=HEADERS)
    assert_openai_error(resp, 413, "request_too_large", str(MAX_BODY))


def test_default_header_limit_is_64_kib(tmp_path: Path) -> None:
    """With the default limits, a 70 KB header block is refused by chatgate (431), not by a crash."""
    with run_chatgate(make_settings(tmp_path)) as running:
        resp = httpx2.get(running.url + "/healthz", headers={"x-big": "b" * 70_000})
        assert_openai_error(resp, 431, "request_headers_too_large", str(64 * 1024))
        assert httpx2.get(running.url + "/healthz").status_code == 200


def test_a_body_that_trickles_in_is_refused_when_its_time_is_up(fake: RunningFake, tmp_path: Path) -> None:
    """Slowloris on the body: a client that sends a byte now and then gets a 408 once
    limits.body_timeout_seconds have passed, instead of holding its connection and handler without end."""
    settings = make_settings(tmp_path, fake.url, limits={"body_timeout_seconds": 0.5})
    before = len(fake.state.requests)
    with run_chatgate(settings) as gate, socket.create_connection(("127.0.0.1", gate.port), 10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer sk-slow\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        conn.settimeout(0.2)
        answer = b""
        while not answer and time.monotonic() - t0 < 5:
            with contextlib.suppress(OSError):
                conn.sendall(b" ")
            with contextlib.suppress(TimeoutError):
                answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"limits.body_timeout_seconds" in answer
    assert len(fake.state.requests) == before


def test_a_body_that_stops_coming_is_cut_off(fake: RunningFake, tmp_path: Path) -> None:
    """A client that sends part of a body and then nothing: the connection is closed
    server.head_timeout_seconds after the last piece."""
    before = len(fake.state.requests)
    with run_chatgate(make_settings(tmp_path, fake.url, server={"head_timeout_seconds": 0.5})) as gate, \
            socket.create_connection(("127.0.0.1", gate.port), 10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer sk-stall\r\nContent-Length: 100\r\n\r\n{\"model\":")
        t0 = time.monotonic()
        assert conn.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t0 < 5
    assert len(fake.state.requests) == before


def test_an_endless_header_is_refused_before_it_is_buffered(gate: RunningChatgate) -> None:
    """httptools buffers a head without a bound: the server protocol answers 431 and closes once a head
    passes twice limits.max_header_bytes (plus room for the request line), whatever the app would say."""
    with socket.create_connection(("127.0.0.1", gate.port), 10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        answer = b""
        with contextlib.suppress(OSError):
            for _ in range(64):  # 1 MiB, far past the bound
                conn.sendall(b"a" * 16384)
        with contextlib.suppress(OSError):  # the server closes with our bytes unread: a reset may follow
            while chunk := conn.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'"code":"request_headers_too_large"' in answer


def test_a_head_that_trickles_in_is_cut_off(fake: RunningFake, tmp_path: Path) -> None:
    """Slowloris on the head: a header line now and then never ends the head; the connection is closed
    server.head_timeout_seconds after it opened."""
    with run_chatgate(make_settings(tmp_path, fake.url, server={"head_timeout_seconds": 0.5})) as gate, \
            socket.create_connection(("127.0.0.1", gate.port), 10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        for _ in range(20):
            time.sleep(0.1)
            with contextlib.suppress(OSError):
                conn.sendall(b"X-Slow: 1\r\n")
        assert conn.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t0 < 5
