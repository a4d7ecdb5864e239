"""DeepSeek's Files API through a real chatgate in front of the fake DeepSeek, with the openai SDK: uploads
arrive byte for byte and streamed, DeepSeek's answers come back as it sent them (errors included, a file's
content streamed), `/files…` and `/v1/files…` both map to DeepSeek's `/files…`. Managed mode swaps the key
(a missing, unknown or revoked one is chatgate's 401); quotas do not apply. Every request is access-logged
and counted in /metrics under its route template, none gets a usage record."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from app.gateway.auth import fingerprint, new_key
from app.metering.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import _read_usage, usage_rows
from tests.harness import RunningChatgate, make_settings, run_chatgate, unreachable_url
from tests.metering.helpers import wait_for
from tests.quotas.support import set_limits

KEY = "sk-files-client-0001"
UPSTREAM = "sk-upstream-account-key"
IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 1000  # binary: every byte value, CRLFs, dashes
CAP = 64 * 1024  # limits.max_file_bytes in the tests that need a small one


class Sent:
    """The bytes the SDK put on the wire for each request (an httpx2 request event hook)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.content_types: list[str | None] = []

    def hook(self, request: httpx2.Request) -> None:
        self.bodies.append(request.read())
        self.content_types.append(request.headers.get("content-type"))


def sdk(base_url: str, key: str = KEY, sent: Sent | None = None) -> openai.OpenAI:
    hooks = {"request": [sent.hook]} if sent is not None else {}
    http = httpx2.Client(event_hooks=hooks, timeout=20)
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http)


def metric(gate: RunningChatgate, route: str, status: int) -> float:
    prefix = f'chatgate_requests_total{{model="",route="{route}",status="{status}"}} '
    for line in httpx2.get(gate.url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return 0.0


def access_lines(gate: RunningChatgate, capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The Files API's access-log lines, oldest first."""
    gate.state.gw.ledger.access_log.flush()
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines()
             if line.startswith('{"event":"request"')]
    return [line for line in lines if line["route"].startswith("/files")]


def assert_no_usage_record(gate: RunningChatgate, tmp_path: Path) -> None:
    wait_for(lambda: gate.state.recorder.pending == 0, 10, "the recorder to be idle")
    assert _read_usage(tmp_path / "usage.db") == []


def multipart(data: bytes = IMAGE, purpose: bytes = b"user_data") -> tuple[bytes, dict[str, str]]:
    body = (b'--b0undary\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose +
            b'\r\n--b0undary\r\nContent-Disposition: form-data; name="file"; filename="cat.png"\r\n'
            b"Content-Type: image/png\r\n\r\n" + data + b"\r\n--b0undary--\r\n")
    return body, {"authorization": f"Bearer {KEY}", "content-type": "multipart/form-data; boundary=b0undary"}


# ------------------------------------------------------------------------------------------- passthrough


@pytest.mark.parametrize("base", ["/v1", ""])
def test_the_sdks_files_calls_go_through_byte_for_byte(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path,
        capfd: pytest.CaptureFixture[str], base: str) -> None:
    gate = start_gate(server={"access_log": True})
    sent = Sent()
    with sdk(gate.url + base, sent=sent) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(IMAGE), "cat.png", "user_data")
        assert [f.id for f in client.files.list(limit=10, order="desc")] == [uploaded.id]
        assert client.files.retrieve(uploaded.id) == uploaded
        content = client.files.content(uploaded.id)
        assert content.read() == IMAGE
        assert client.files.delete(uploaded.id).deleted is True
    got = fake.state.requests
    assert [(r.method, r.path) for r in got] == [
        ("POST", "/files"), ("GET", "/files"), ("GET", f"/files/{uploaded.id}"),
        ("GET", f"/files/{uploaded.id}/content"), ("DELETE", f"/files/{uploaded.id}")]
    assert [r.body for r in got] == sent.bodies, "bodies arrive as the SDK sent them"
    upload = got[0]
    assert upload.headers["content-type"] == sent.content_types[0], "the multipart boundary with it"
    assert upload.headers["content-length"] == str(len(upload.body)), "the upload keeps its framing"
    assert got[1].query == "limit=10&order=desc"
    assert {r.auth_key for r in got} == {KEY}
    assert content.response.headers["content-length"] == str(len(IMAGE))
    lines = access_lines(gate, capfd)
    assert [(line["method"], line["route"], line["status"], line["outcome"]) for line in lines] == [
        ("POST", "/files", 200, "ok"), ("GET", "/files", 200, "ok"), ("GET", "/files/{file_id}", 200, "ok"),
        ("GET", "/files/{file_id}/content", 200, "ok"), ("DELETE", "/files/{file_id}", 200, "ok")]
    assert {line["key_id"] for line in lines} == {fingerprint(KEY)}
    assert [line["request_id"] for line in lines] == [r.request_id for r in got]
    assert KEY not in json.dumps(lines)
    assert (metric(gate, "/files", 200), metric(gate, "/files/{file_id}", 200),
            metric(gate, "/files/{file_id}/content", 200)) == (2, 2, 1)
    assert_no_usage_record(gate, tmp_path)


def test_the_request_id_and_headers_are_forwarded_as_on_every_route(gate: RunningChatgate,
                                                                     fake: RunningFake) -> None:
    body, headers = multipart()
    response = httpx2.post(gate.url + "/v1/files", content=body, timeout=10,
                           headers={**headers, "x-request-id": "upload-1", "x-team-label": "search",
                                    "connection": "keep-alive, x-hop", "x-hop": "dropped"})
    assert response.status_code == 200
    (rec,) = fake.state.requests
    assert (rec.request_id, rec.headers["x-team-label"], rec.body) == ("upload-1", "search", body)
    assert "x-hop" not in rec.headers
    assert response.headers["x-request-id"] == "upload-1" and "x-ds-trace-id" in response.headers
    assert response.content == bytes(rec.sent), "relayed as DeepSeek sent it"


def test_deepseeks_errors_pass_through_unchanged(gate: RunningChatgate, fake: RunningFake, tmp_path: Path
                                                 ) -> None:
    with sdk(gate.url + "/v1") as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            client.files.retrieve("file-api-nope")
        with pytest.raises(openai.BadRequestError) as purpose:
            client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="fine-tune")
        with pytest.raises(openai.InternalServerError) as overloaded:
            client.files.list(extra_headers={"x-fake-fault": "http_503"})
        with sdk(gate.url, "sk-bad-key-0042") as stranger, pytest.raises(openai.AuthenticationError) as bad:
            stranger.files.list()
    answers = [unknown.value.response, purpose.value.response, overloaded.value.response, bad.value.response]
    assert [a.status_code for a in answers] == [404, 400, 503, 401]
    assert [a.content for a in answers] == [bytes(r.sent) for r in fake.state.requests]
    assert "Invalid purpose" in purpose.value.message and "****0042" in bad.value.message
    assert (metric(gate, "/files/{file_id}", 404), metric(gate, "/files", 503)) == (1, 1)
    assert_no_usage_record(gate, tmp_path)


def test_unreachable_deepseek_is_502(start_gate: Callable[..., RunningChatgate], tmp_path: Path,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(upstream_url=unreachable_url(), server={"access_log": True})
    with sdk(gate.url + "/v1") as client, pytest.raises(openai.APIStatusError) as down:
        client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
    assert down.value.status_code == 502
    error = down.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unreachable")
    (line,) = access_lines(gate, capfd)
    assert (line["status"], line["outcome"], line["code"]) == (502, "upstream_failed", "upstream_unreachable")
    assert metric(gate, "/files", 502) == 1
    assert_no_usage_record(gate, tmp_path)


def test_other_methods_are_405_and_dot_segments_404(gate: RunningChatgate, fake: RunningFake) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    assert httpx2.put(gate.url + "/files/file-api-1", headers=auth).status_code == 405
    assert httpx2.delete(gate.url + "/v1/files", headers=auth).status_code == 405
    assert httpx2.post(gate.url + "/files/file-api-1/content", headers=auth).status_code == 405
    # `..` would resolve to DeepSeek's other routes, with the upstream key in managed mode
    for path in ("/files/..", "/v1/files/%2E%2E/content", "/files/."):
        status, body = raw_get(gate, path)
        assert status == 404 and orjson.loads(body)["error"]["code"] == "not_found", path
    assert fake.state.requests == []


def raw_get(gate: RunningChatgate, path: str) -> tuple[int, bytes]:
    """GET the path exactly as written (httpx2 would resolve its dot segments before sending)."""
    connection = http.client.HTTPConnection("127.0.0.1", gate.port, timeout=10)
    try:
        connection.request("GET", path, headers={"authorization": f"Bearer {KEY}"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_an_id_is_forwarded_as_one_path_segment(gate: RunningChatgate, fake: RunningFake) -> None:
    response = httpx2.get(gate.url + "/files/file%20api%3F1", headers={"authorization": f"Bearer {KEY}"})
    assert response.status_code == 404
    (rec,) = fake.state.requests
    assert (rec.path, rec.query) == ("/files/file api?1", "")


# ------------------------------------------------------------------------------------------- streaming


class Tap(httpx2.AsyncBaseTransport):
    """chatgate's real upstream transport, noting when the first bytes of an upload leave chatgate."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.first_chunk = threading.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        tap, stream = self, request.stream
        assert isinstance(stream, httpx2.AsyncByteStream)

        class Tapped(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:
                    tap.first_chunk.set()
                    yield chunk

        tapped = httpx2.Request(request.method, request.url, headers=request.headers, stream=Tapped(),
                                extensions=request.extensions)
        return await self.inner.handle_async_request(tapped)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_an_upload_is_streamed_not_buffered(start_gate: Callable[..., RunningChatgate],
                                            fake: RunningFake) -> None:
    tap = Tap()
    gate = start_gate(transport=tap)
    body, headers = multipart()
    streamed: list[bool] = []

    def halves() -> Iterator[bytes]:
        yield body[:len(body) // 2]
        streamed.append(tap.first_chunk.wait(5))  # chatgate buffering the body would never send it
        yield body[len(body) // 2:]

    response = httpx2.post(gate.url + "/files", content=halves(), headers=headers, timeout=20)
    assert response.status_code == 200 and streamed == [True]
    (rec,) = fake.state.requests
    assert rec.body == body and rec.headers["transfer-encoding"] == "chunked"
    assert fake.state.files[response.json()["id"]].content == IMAGE


def test_a_download_is_streamed_and_a_client_gone_closes_it(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, capfd: pytest.CaptureFixture[str]
        ) -> None:
    gate = start_gate(server={"access_log": True})
    large = bytes(range(256)) * 1024  # 4 pieces of the fake's 64 KiB, 1 s apart
    with sdk(gate.url) as client:
        uploaded = client.files.create(file=("big.png", large, "image/png"), purpose="user_data")
    t0 = time.monotonic()
    with httpx2.stream("GET", f"{gate.url}/files/{uploaded.id}/content", timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "x-fake-chunk-delay": "1",
                                "x-request-id": "download-gone"}) as response:
        first = next(response.iter_raw())
        waited = time.monotonic() - t0
    assert first == large[:len(first)] and waited < 1.0, "the first piece arrives before the last is sent"
    wait_for(lambda: fake.state.requests[-1].outcome == "client_disconnected", 2.5,
             "DeepSeek's response to be closed")
    wait_for(lambda: metric(gate, "/files/{file_id}/content", 499) == 1, 5, "the request to be counted")
    line = next(line for line in access_lines(gate, capfd) if line["request_id"] == "download-gone")
    assert (line["status"], line["outcome"]) == (499, "client_disconnected")


def test_a_download_cut_by_deepseek_is_an_error_not_a_short_file(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, capfd: pytest.CaptureFixture[str]
        ) -> None:
    gate = start_gate(server={"access_log": True})
    with sdk(gate.url) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        with pytest.raises(openai.APIConnectionError):
            client.files.content(uploaded.id, extra_headers={"x-fake-fault": "reset_mid_stream"}).read()
    line = access_lines(gate, capfd)[-1]
    assert (line["route"], line["status"], line["outcome"], line["code"]) == (
        "/files/{file_id}/content", 502, "upstream_failed", "upstream_body_broken")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_client_gone_mid_upload_aborts_it(start_gate: Callable[..., RunningChatgate], fake: RunningFake,
                                            capfd: pytest.CaptureFixture[str], transport: str) -> None:
    gate = start_gate(server={"access_log": True}, upstream={"transport": transport})
    body, _ = multipart()
    head = (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: multipart/form-data; boundary=b0undary\r\nx-request-id: upload-gone\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", gate.port)) as sock:
        sock.sendall(head + body[:4096])
        time.sleep(0.3)
    wait_for(lambda: metric(gate, "/files", 499) == 1, 5, "the abandoned upload to be counted")
    (line,) = access_lines(gate, capfd)
    assert (line["request_id"], line["status"]) == ("upload-gone", 499)
    assert line["outcome"] == "client_disconnected"
    assert fake.state.wait_idle(5)
    assert fake.state.files == {}, "DeepSeek got a cut upload, never a file"


# ------------------------------------------------------------------------------------------- size cap


def test_an_upload_over_the_cap_is_413_before_deepseek(start_gate: Callable[..., RunningChatgate],
                                                       fake: RunningFake, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True}, limits={"max_file_bytes": CAP})
    with sdk(gate.url + "/v1") as client:
        small = client.files.create(file=("small.png", IMAGE[:CAP // 2], "image/png"), purpose="user_data")
        with pytest.raises(openai.APIStatusError) as refused:
            client.files.create(file=("big.png", IMAGE, "image/png"), purpose="user_data")
    assert small.bytes == CAP // 2
    assert refused.value.status_code == 413
    error = refused.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    assert f"{CAP} bytes (limits.max_file_bytes)" in error["message"]
    assert [r.method for r in fake.state.requests] == ["POST"], "the refused upload never reaches DeepSeek"
    assert [(line["status"], line["outcome"], line["key_id"]) for line in access_lines(gate, capfd)] == [
        (200, "ok", fingerprint(KEY)), (413, "refused", fingerprint(KEY))]
    assert metric(gate, "/files", 413) == 1
    assert_no_usage_record(gate, tmp_path)


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_chunked_upload_over_the_cap_is_cut_and_413(start_gate: Callable[..., RunningChatgate],
                                                      fake: RunningFake, transport: str) -> None:
    gate = start_gate(limits={"max_file_bytes": CAP}, upstream={"transport": transport})
    body, headers = multipart()

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(body), 16 * 1024):
            yield body[start:start + 16 * 1024]

    response = httpx2.post(gate.url + "/files", content=pieces(), headers=headers, timeout=20)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert fake.state.wait_idle(5)
    assert fake.state.files == {}, "DeepSeek got a cut upload, never a file"
    assert all(len(r.body) <= CAP for r in fake.state.requests)


# ------------------------------------------------------------------------------------------- managed


@pytest.fixture
def managed(tmp_path: Path, fake: RunningFake, capfd: pytest.CaptureFixture[str]
            ) -> Iterator[tuple[RunningChatgate, SQLiteStore, str, str]]:
    """chatgate in managed mode with the upstream key and one client key: (gate, store, key id, secret)."""
    store = SQLiteStore(tmp_path / "usage.db")
    settings = make_settings(tmp_path, fake.url, server={"access_log": True}, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "key_cache_seconds": 0},
        limits={"cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        yield gate, store, key_id, secret


def test_managed_swaps_the_key_and_refuses_strangers(
        managed: tuple[RunningChatgate, SQLiteStore, str, str], fake: RunningFake,
        capfd: pytest.CaptureFixture[str]) -> None:
    gate, store, key_id, secret = managed
    with sdk(gate.url + "/v1", secret) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data",
                                       extra_headers={"x-api-key": secret})
        assert client.files.content(uploaded.id).read() == IMAGE
    assert [r.auth_key for r in fake.state.requests] == [UPSTREAM, UPSTREAM]
    assert secret not in orjson.dumps([r.headers for r in fake.state.requests]).decode()
    with sdk(gate.url, "cg-not-a-key") as stranger, pytest.raises(openai.AuthenticationError) as unknown:
        stranger.files.list()
    missing = httpx2.post(gate.url + "/files", content=multipart()[0], timeout=10,
                          headers={"content-type": "multipart/form-data; boundary=b0undary"})
    assert (unknown.value.status_code, missing.status_code) == (401, 401)
    assert {unknown.value.response.json()["error"]["code"], missing.json()["error"]["code"]} == {
        "invalid_api_key"}
    store.revoke_key(key_id)  # auth.key_cache_seconds = 0: refused at once
    with sdk(gate.url, secret) as revoked, pytest.raises(openai.AuthenticationError):
        revoked.files.retrieve(uploaded.id)
    assert len(fake.state.requests) == 2, "nothing refused reaches DeepSeek"
    lines = access_lines(gate, capfd)
    assert [(line["status"], line["outcome"], line.get("key_id")) for line in lines] == [
        (200, "ok", key_id), (200, "ok", key_id), (401, "refused", None), (401, "refused", None),
        (401, "refused", None)]
    assert (metric(gate, "/files", 401), metric(gate, "/files/{file_id}", 401)) == (2, 1)


def test_quotas_do_not_apply_to_files(managed: tuple[RunningChatgate, SQLiteStore, str, str],
                                      fake: RunningFake, tmp_path: Path) -> None:
    gate, _, key_id, secret = managed
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_id, rpm=1)
    with sdk(gate.url + "/v1", secret) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        assert [f.id for f in client.files.list()] == [uploaded.id]
        ask = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
        client.chat.completions.create(**ask)  # the minute's one request: the file calls took none
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**ask)
        assert client.files.delete(uploaded.id).deleted is True
    assert [r.path for r in fake.state.requests].count("/chat/completions") == 1
    rows = usage_rows(tmp_path, 2)
    assert sorted(row["outcome"] for row in rows) == ["limited", "ok"], "the chats' records, no file's"


# ------------------------------------------------------------------------------------------- chat


def test_a_chat_with_an_uploaded_file_part_works_as_before(gate: RunningChatgate, fake: RunningFake) -> None:
    sent = Sent()
    with sdk(gate.url + "/v1", sent=sent) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        reply = client.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "file", "file": {"file_id": uploaded.id}}]}])
    assert reply.choices[0].message.content == "Answer 1: the fake DeepSeek says hello."
    chat = fake.state.requests[-1]
    assert chat.path == "/chat/completions" and chat.body == sent.bodies[-1]
    assert chat.json["messages"][0]["content"][1] == {"type": "file", "file": {"file_id": uploaded.id}}
