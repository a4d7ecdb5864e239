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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import fingerprint, new_key
from chatgate.store.base import FileOwner, StoreError
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import _read_usage, usage_rows
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate, unreachable_url
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


def access_lines_any(gate: RunningChatgate, capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    gate.state.gw.ledger.access_log.flush()
    return [json.loads(line) for line in capfd.readouterr().out.splitlines()
            if line.startswith('{"event":"request"')]


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


# ------------------------------------------------------------------------------------------- team ownership

ADMIN = ADMIN_KEY  # tests/harness.py: a key chatgate accepts at start


class Teams:
    """chatgate in managed mode with the admin key and client keys: two of team search, one of team ads."""

    def __init__(self, gate: RunningChatgate, store: SQLiteStore) -> None:
        self.gate, self.store = gate, store
        self.keys: dict[str, tuple[str, str]] = {}  # name -> (key id, secret)
        for name, team in (("a1", "search"), ("a2", "search"), ("b1", "ads")):
            key_id, secret, digest, prefix = new_key()
            store.create_key(key_id, digest, prefix, team, name)
            self.keys[name] = (key_id, secret)

    def sdk(self, name: str) -> openai.OpenAI:
        return sdk(self.gate.url + "/v1", ADMIN if name == "admin" else self.keys[name][1])

    def upload(self, name: str, data: bytes = IMAGE) -> str:
        with self.sdk(name) as client:
            return client.files.create(file=(f"{name}.png", data, "image/png"), purpose="user_data").id


@contextmanager
def start_teams(tmp_path: Path, fake: RunningFake, store: SQLiteStore) -> Iterator[Teams]:
    settings = make_settings(tmp_path, fake.url, server={"access_log": True}, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "admin_key": ADMIN, "key_cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        yield Teams(gate, store)


@pytest.fixture
def teams(tmp_path: Path, fake: RunningFake, capfd: pytest.CaptureFixture[str]) -> Iterator[Teams]:
    with start_teams(tmp_path, fake, SQLiteStore(tmp_path / "usage.db")) as started:
        yield started


def unknown_id_answer(file_id: str) -> dict[str, Any]:
    """The fake DeepSeek's answer to an id it does not know (chatgate/demo/files.py)."""
    error = {"message": f"No such file: {file_id}", "type": "not_found_error", "param": None,
             "code": "invalid_request_error"}
    return {"error": error}


def test_another_team_cannot_reach_a_file_and_the_owners_team_can(
        teams: Teams, fake: RunningFake, capfd: pytest.CaptureFixture[str]) -> None:
    mine = teams.upload("a1")
    (a1_id, _), (b1_id, _) = teams.keys["a1"], teams.keys["b1"]
    assert teams.store.file_owner(mine) is not None
    assert (teams.store.file_owner(mine).team, teams.store.file_owner(mine).key_id) == ("search", a1_id)
    before = len(fake.state.requests)
    with teams.sdk("b1") as b1:
        calls = (lambda: b1.files.retrieve(mine), lambda: b1.files.content(mine).read(),
                 lambda: b1.files.delete(mine), lambda: b1.files.retrieve("file-api-never-was"))
        refusals = []
        for call in calls:
            with pytest.raises(openai.NotFoundError) as refused:
                call()
            refusals.append(refused.value.response.json())
        assert [f.id for f in b1.files.list()] == []
    assert refusals == [unknown_id_answer(mine)] * 3 + [unknown_id_answer("file-api-never-was")]
    assert [r.method for r in fake.state.requests[before:]] == ["GET"], "only the list reached DeepSeek"
    assert mine in fake.state.files
    with teams.sdk("a2") as a2:  # another key of the team
        assert a2.files.retrieve(mine).id == mine
        assert a2.files.content(mine).read() == IMAGE
        assert [f.id for f in a2.files.list()] == [mine]
    lines = [line for line in access_lines(teams.gate, capfd) if line["key_id"] == b1_id]
    assert [(line["status"], line["outcome"], line["code"]) for line in lines] == [
        (404, "refused", "file_not_owned")] * 4 + [(200, "ok", None)]


def chat_naming(file_id: str, flat: bool = False) -> list[dict[str, Any]]:
    part = {"type": "file", "file_id": file_id} if flat else {"type": "file", "file": {"file_id": file_id}}
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"}, part]}]


def test_a_chat_may_name_its_teams_files_only(teams: Teams, fake: RunningFake, tmp_path: Path) -> None:
    mine = teams.upload("a1")
    with teams.sdk("a2") as a2:  # the team's other key: forwarded as sent
        assert a2.chat.completions.create(model="deepseek-flash", messages=chat_naming(mine)).choices
    assert fake.state.requests[-1].path == "/chat/completions"
    before = len(fake.state.requests)
    refusals = []
    with teams.sdk("b1") as b1:
        for file_id, flat in ((mine, False), (mine, True), ("file-api-never-was", False)):
            with pytest.raises(openai.NotFoundError) as refused:
                b1.chat.completions.create(model="deepseek-flash", messages=chat_naming(file_id, flat))
            refusals.append(refused.value.response.json()["error"])
    assert len(fake.state.requests) == before, "nothing reached DeepSeek"
    param = "messages[0].content[1].file.file_id"
    assert refusals == [
        {**unknown_id_answer(mine)["error"], "param": param},
        {**unknown_id_answer(mine)["error"], "param": "messages[0].content[1].file_id"},
        {**unknown_id_answer("file-api-never-was")["error"], "param": param},
    ], "another team's file is answered as one that does not exist"
    rows = usage_rows(tmp_path, 4)  # the upload is not metered, the chats are
    assert [(r["key_name"], r["outcome"], r["upstream_status"], r["rule_code"]) for r in rows] == [
        ("a2", "ok", 200, None)] + [("b1", "rejected", None, "file_not_owned")] * 3


def test_a_file_named_with_an_escaped_key_is_checked_too(teams: Teams, fake: RunningFake) -> None:
    theirs = teams.upload("b1")
    part = b'{"type":"file","file\\u005fid":"' + theirs.encode() + b'"}'
    body = b'{"model":"deepseek-flash","messages":[{"role":"user","content":[' + part + b']}]}'
    assert orjson.loads(body)["messages"][0]["content"][0] == {"type": "file", "file_id": theirs}
    before = len(fake.state.requests)
    resp = httpx2.post(teams.gate.url + "/v1/chat/completions", content=body, headers={
        "authorization": f"Bearer {teams.keys['a1'][1]}", "content-type": "application/json"})
    assert resp.status_code == 404 and resp.json()["error"]["message"] == f"No such file: {theirs}"
    assert len(fake.state.requests) == before


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/anthropic/v1/messages",
     lambda f: {"model": "deepseek-flash", "max_tokens": 100, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "and this?"},
         {"type": "image", "source": {"type": "file", "file_id": f}}]}]},
     "messages[0].content[1].source.file_id"),
    ("/v1/responses",
     lambda f: {"model": "deepseek-flash", "input": [{"role": "user", "content": [
         {"type": "input_text", "text": "and this?"}, {"type": "input_file", "file_id": f}]}]},
     "input[0].content[1].file_id"),
])
def test_the_anthropic_and_responses_routes_check_file_owners_too(
        teams: Teams, fake: RunningFake, path: str, body: Callable[[str], dict[str, Any]], param: str
) -> None:
    theirs = teams.upload("b1")
    before = len(fake.state.requests)
    resp = httpx2.post(teams.gate.url + path, json=body(theirs), headers={
        "authorization": f"Bearer {teams.keys['a1'][1]}", "anthropic-beta": "files-api-2025-04-14"})
    assert resp.status_code == 404, resp.text
    assert f"No such file: {theirs}" in resp.text and param in resp.text
    assert len(fake.state.requests) == before


class OwnersDownStore(SQLiteStore):
    """A store that cannot say who owns a file (an outage)."""

    def files_owned(self, team: str, file_ids: Any) -> set[str]:
        raise StoreError("the store is down")


def test_a_chat_naming_a_file_is_503_when_owners_cannot_be_checked(tmp_path: Path, fake: RunningFake) -> None:
    with start_teams(tmp_path, fake, OwnersDownStore(tmp_path / "usage.db")) as teams:
        with teams.sdk("a1") as a1, pytest.raises(openai.InternalServerError) as failed:
            a1.chat.completions.create(model="deepseek-flash", messages=chat_naming("file-any"))
        assert failed.value.status_code == 503
        assert failed.value.response.json()["error"]["code"] == "store_unavailable"
        with teams.sdk("a1") as a1:  # a chat naming no file does not ask
            assert a1.chat.completions.create(model="deepseek-flash", messages=[
                {"role": "user", "content": "hello"}]).choices
        assert [r.path for r in fake.state.requests] == ["/chat/completions"]


def test_a_delete_by_the_team_removes_the_file_and_its_owner(teams: Teams, fake: RunningFake) -> None:
    mine = teams.upload("a1")
    with teams.sdk("a2") as a2:
        assert a2.files.delete(mine).deleted is True
        with pytest.raises(openai.NotFoundError):
            a2.files.retrieve(mine)
    assert teams.store.file_owner(mine) is None and mine not in fake.state.files
    assert [r.method for r in fake.state.requests] == ["POST", "DELETE"], "the retrieve is chatgate's 404"


def test_a_list_walks_the_teams_files_page_by_page(teams: Teams, fake: RunningFake) -> None:
    """Files of two teams interleaved: each page is full of the team's files, and the SDK's pagination (after
    the page's last id) walks them all, in either order, and none of the other team's."""
    ours, theirs = [], []
    for _ in range(5):
        ours.append(teams.upload("a1", b"ours"))
        theirs += [teams.upload("b1", b"theirs"), teams.upload("b1", b"theirs")]
    with teams.sdk("a2") as a2, teams.sdk("b1") as b1:
        first = a2.files.list(limit=2)
        assert ([f.id for f in first.data], first.has_more) == (ours[:2], True)
        raw = a2.files.with_raw_response.list(limit=2).http_response.json()
        assert (raw["object"], raw["first_id"], raw["last_id"]) == ("list", ours[0], ours[1])
        assert [f.id for f in a2.files.list(limit=2)] == ours, "auto-paginated"
        assert [f.id for f in a2.files.list(limit=3, order="desc")] == ours[::-1]
        last = a2.files.list(limit=2, after=ours[3])
        assert ([f.id for f in last.data], last.has_more) == ([ours[4]], False)
        assert [f.id for f in b1.files.list(limit=4)] == theirs
        with pytest.raises(openai.NotFoundError) as foreign:
            a2.files.list(after=theirs[0])
    assert foreign.value.response.json()["error"]["param"] == "after"


def test_a_page_of_other_teams_files_is_skipped_not_returned_empty(teams: Teams, fake: RunningFake) -> None:
    theirs = [teams.upload("b1", b"theirs") for _ in range(3)]
    ours = teams.upload("a1", b"ours")
    with teams.sdk("a1") as a1:
        page = a1.files.list(limit=1)
        assert ([f.id for f in page.data], page.has_more) == ([ours], False)
        empty = a1.files.list(limit=1, purpose="text_recognition")
        assert (empty.data, empty.has_more) == ([], False)
    lists = [r.query for r in fake.state.requests if r.method == "GET"]
    assert lists[:2] == ["limit=1", f"after={theirs[0]}&limit=1000"]
    assert len(lists) == 3


def test_a_list_error_from_deepseek_passes_through(teams: Teams, fake: RunningFake) -> None:
    with teams.sdk("a1") as a1, pytest.raises(openai.InternalServerError) as overloaded:
        a1.files.list(extra_headers={"x-fake-fault": "http_503"})
    assert overloaded.value.response.content == bytes(fake.state.requests[-1].sent)


def test_the_admin_key_sees_every_file_and_older_ones_belong_to_no_team(teams: Teams, fake: RunningFake
                                                                        ) -> None:
    """A file uploaded before chatgate recorded owners has none: no team sees it, the admin key does (and may
    delete it)."""
    older = httpx2.post(fake.url + "/files", content=multipart()[0], timeout=10, headers={
        **multipart()[1], "authorization": f"Bearer {UPSTREAM}"}).json()["id"]
    ours, theirs = teams.upload("a1"), teams.upload("b1")
    with teams.sdk("a1") as a1:
        assert [f.id for f in a1.files.list()] == [ours]
        with pytest.raises(openai.NotFoundError):
            a1.files.retrieve(older)
    with teams.sdk("admin") as admin:
        assert [f.id for f in admin.files.list()] == [older, ours, theirs]
        assert admin.files.content(theirs).read() == IMAGE
        assert admin.files.delete(older).deleted and admin.files.delete(theirs).deleted
    assert teams.store.file_owner(theirs) is None and set(fake.state.files) == {ours}
    assert {r.auth_key for r in fake.state.requests} == {UPSTREAM}
    assert ADMIN not in orjson.dumps([r.headers for r in fake.state.requests]).decode()


class OwnerlessStore(SQLiteStore):
    """A store that cannot record a file's owner (an outage)."""

    def own_file(self, owner: FileOwner) -> bool:
        raise StoreError("the store is down")


def test_an_upload_whose_owner_cannot_be_recorded_fails_and_is_deleted(tmp_path: Path, fake: RunningFake,
                                                                        capfd: pytest.CaptureFixture[str]
                                                                        ) -> None:
    with start_teams(tmp_path, fake, OwnerlessStore(tmp_path / "usage.db")) as teams:
        with teams.sdk("a1") as a1, pytest.raises(openai.InternalServerError) as failed:
            a1.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        assert failed.value.status_code == 503
        assert failed.value.response.json()["error"]["code"] == "store_unavailable"
        assert [r.method for r in fake.state.requests] == ["POST", "DELETE"]
        assert fake.state.files == {}, "no file is left that nobody owns"


def test_passthrough_records_no_owner(gate: RunningChatgate, fake: RunningFake) -> None:
    with sdk(gate.url) as client, sdk(gate.url, "sk-another-client-0002") as other:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(uploaded.id)  # DeepSeek's own isolation, per key
    assert gate.state.store.file_owner(uploaded.id) is None
    assert [r.method for r in fake.state.requests] == ["POST", "GET"], "forwarded as before"


def test_a_list_asks_deepseek_for_a_bounded_number_of_pages(teams: Teams, fake: RunningFake,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chatgate.files.routes.MAX_LIST_PAGES", 1)
    for _ in range(3):
        teams.upload("b1", b"theirs")
    ours = teams.upload("a1", b"ours")
    with teams.sdk("a1") as a1:
        page = a1.files.list(limit=1)
        assert (page.data, page.has_more) == ([], True), "the scan stopped: nothing yet, maybe more"
        assert [f.id for f in a1.files.list(limit=1, order="desc")] == [ours]


# ------------------------------------------------------------------------------------------- Anthropic format


def anthropic_sdk(base_url: str, key: str = KEY, sent: Sent | None = None) -> Any:
    import anthropic

    hooks = {"request": [sent.hook]} if sent is not None else {}
    http = httpx2.Client(event_hooks=hooks, timeout=20)
    beta = {"anthropic-beta": "files-api-2025-04-14"}  # DeepSeek's guide: required for its Files API
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, http_client=http,
                               default_headers=beta)


def test_the_anthropic_sdks_files_calls_go_through_byte_for_byte(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, capfd: pytest.CaptureFixture[str]
) -> None:
    gate = start_gate(server={"access_log": True})
    sent = Sent()
    client = anthropic_sdk(gate.url + "/anthropic", sent=sent)
    uploaded = client.beta.files.upload(file=("cat.png", IMAGE, "image/png"))
    assert (uploaded.filename, uploaded.mime_type) == ("cat.png", "image/png")
    assert uploaded.size_bytes == len(IMAGE)
    second = client.beta.files.upload(file=("dog.png", b"woof", "image/png"))
    assert [f.id for f in client.beta.files.list(limit=1)] == [second.id, uploaded.id], "paged"
    client.beta.files.delete(second.id)
    assert client.beta.files.retrieve_metadata(uploaded.id) == uploaded
    assert client.beta.files.download(uploaded.id).read() == IMAGE
    assert client.beta.files.delete(uploaded.id).id == uploaded.id
    got = fake.state.requests
    assert [(r.method, r.path) for r in got] == [
        ("POST", "/anthropic/v1/files"), ("POST", "/anthropic/v1/files"), ("GET", "/anthropic/v1/files"),
        ("GET", "/anthropic/v1/files"), ("DELETE", f"/anthropic/v1/files/{second.id}"),
        ("GET", f"/anthropic/v1/files/{uploaded.id}"), ("GET", f"/anthropic/v1/files/{uploaded.id}/content"),
        ("DELETE", f"/anthropic/v1/files/{uploaded.id}")]
    assert got[3].query == "limit=1&page=page_1"
    assert [r.body for r in got] == sent.bodies, "bodies arrive as the SDK sent them"
    assert all("files-api-2025-04-14" in r.headers["anthropic-beta"] for r in got), "the SDK's beta header"
    assert got[0].headers["content-type"] == sent.content_types[0]
    lines = [line for line in access_lines_any(gate, capfd)
             if line["route"].startswith("/anthropic/v1/files")]
    assert [(line["route"], line["status"]) for line in lines] == [
        ("/anthropic/v1/files", 200)] * 4 + [("/anthropic/v1/files/{file_id}", 200)] * 2 + [
        ("/anthropic/v1/files/{file_id}/content", 200), ("/anthropic/v1/files/{file_id}", 200)]


def test_anthropic_format_file_errors_come_back_as_deepseek_sent_them(gate: RunningChatgate,
                                                                      fake: RunningFake) -> None:
    import anthropic

    client = anthropic_sdk(gate.url + "/anthropic")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.beta.files.retrieve_metadata("file_never_was")
    assert missing.value.response.json() == {
        "type": "error", "error": {"type": "not_found_error", "message": "File not found: file_never_was"}}
    no_beta = httpx2.get(gate.url + "/anthropic/v1/files", headers={"x-api-key": KEY})
    assert no_beta.status_code == 400 and "anthropic-beta" in no_beta.text, "DeepSeek's answer, relayed"
    assert [r.path for r in fake.state.requests] == [
        "/anthropic/v1/files/file_never_was", "/anthropic/v1/files"]


def test_managed_mode_serves_anthropic_format_files_to_the_admin_key_only(teams: Teams, fake: RunningFake
                                                                         ) -> None:
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as refused:
        anthropic_sdk(teams.gate.url + "/anthropic", teams.keys["a1"][1]).beta.files.list()
    error = refused.value.response.json()
    assert error["type"] == "error" and error["error"]["code"] == "not_served"
    assert "/v1/files" in error["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_sdk(teams.gate.url + "/anthropic", "cg-not-a-key").beta.files.list()
    assert fake.state.requests == [], "nothing reached DeepSeek"
    admin = anthropic_sdk(teams.gate.url + "/anthropic", ADMIN)
    uploaded = admin.beta.files.upload(file=("cat.png", IMAGE, "image/png"))
    assert [f.id for f in admin.beta.files.list()] == [uploaded.id]
    assert {r.auth_key for r in fake.state.requests} == {UPSTREAM}
