"""The fake DeepSeek's Files API itself, over real loopback HTTP, with the openai SDK and httpx2."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import openai
import pytest

from chatgate.demo.files import parse_multipart
from tests.fakes.server import RunningFake, run_fake_deepseek

KEY = "sk-files-0001"
OTHER = "sk-files-0002"
IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 300  # binary, with CRLFs and boundary-like bytes


@pytest.fixture(scope="module")
def server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(server: RunningFake) -> Iterator[RunningFake]:
    server.state.reset()
    yield server
    server.state.wait_idle(5)
    server.state.reset()


def sdk(fake: RunningFake, key: str = KEY, base: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url + base, api_key=key, max_retries=0, timeout=10)


def multipart(*parts: tuple[str, bytes, str | None]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body of (name, data, filename) parts, in this order."""
    body = b""
    for name, data, filename in parts:
        extra = f'; filename="{filename}"' if filename else ""
        body += f'--b0undary\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode() + data
        body += b"\r\n"
    headers = {"authorization": f"Bearer {KEY}", "content-type": "multipart/form-data; boundary=b0undary"}
    return body + b"--b0undary--\r\n", headers


@pytest.mark.parametrize("base", ["", "/v1"])
def test_upload_list_retrieve_content_delete(fake: RunningFake, base: str) -> None:
    with sdk(fake, base=base) as client:
        uploaded = client.files.create(file=("cat.png", IMAGE, "image/png"), purpose="user_data")
        assert uploaded.id.startswith("file-api-") and uploaded.object == "file"
        assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(IMAGE), "cat.png", "user_data")
        assert "expires_at" not in uploaded.model_dump(exclude_none=True)
        assert [f.id for f in client.files.list()] == [uploaded.id]
        assert client.files.retrieve(uploaded.id) == uploaded
        assert client.files.content(uploaded.id).read() == IMAGE
        deleted = client.files.delete(uploaded.id)
        assert (deleted.id, deleted.deleted) == (uploaded.id, True)
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)
        assert list(client.files.list()) == []


def test_files_belong_to_the_key_that_uploaded_them(fake: RunningFake) -> None:
    with sdk(fake) as mine, sdk(fake, OTHER) as theirs:
        uploaded = mine.files.create(file=("a.png", IMAGE, "image/png"), purpose="user_data")
        assert list(theirs.files.list()) == []
        for call in (theirs.files.retrieve, theirs.files.delete, theirs.files.content):
            with pytest.raises(openai.NotFoundError):
                call(uploaded.id)
        assert mine.files.retrieve(uploaded.id).id == uploaded.id


def test_bad_and_missing_keys_are_401(fake: RunningFake) -> None:
    with sdk(fake, "sk-bad-0042") as client, pytest.raises(openai.AuthenticationError) as bad:
        client.files.list()
    assert "****0042 is invalid" in bad.value.message
    missing = httpx2.get(fake.url + "/files")
    assert missing.status_code == 401 and "auth header format" in missing.json()["error"]["message"]


def test_list_pages_in_order(fake: RunningFake) -> None:
    with sdk(fake) as client:
        ids = [client.files.create(file=(f"{i}.png", IMAGE, "image/png"), purpose="user_data").id
               for i in range(5)]
        first = client.files.list(limit=2)
        assert [f.id for f in first.data] == ids[:2] and first.has_more
        assert [f.id for f in client.files.list(limit=2)] == ids, "the SDK follows `after` to the end"
        assert [f.id for f in client.files.list(order="desc")] == ids[::-1]
        assert list(client.files.list(purpose="text_recognition")) == []
        with pytest.raises(openai.BadRequestError):
            client.files.list(limit=1001)
    queries = [r.query for r in fake.state.requests if r.method == "GET"]
    assert queries[:3] == ["limit=2", "limit=2", f"limit=2&after={ids[1]}"]


def test_expiry_is_optional_and_checked(fake: RunningFake) -> None:
    with sdk(fake) as client:
        kept = client.files.create(file=("a.png", IMAGE, "image/png"), purpose="user_data",
                                   expires_after={"anchor": "created_at", "seconds": 3600})
        assert kept.expires_at == kept.created_at + 3600
        with pytest.raises(openai.BadRequestError, match="expires_after"):
            client.files.create(file=("a.png", IMAGE, "image/png"), purpose="user_data",
                                expires_after={"anchor": "created_at", "seconds": 60})


@pytest.mark.parametrize(("parts", "message"), [
    ((("file", IMAGE, "a.png"), ("purpose", b"user_data", None)), "purpose field must come before"),
    ((("purpose", b"fine-tune", None), ("file", IMAGE, "a.png")), "Invalid purpose"),
    ((("purpose", b"user_data", None),), "Missing required field: file"),
    ((("file", IMAGE, "a.png"),), "Missing required field: purpose"),
    ((("purpose", b"user_data", None), ("file", b"", "a.png")), "empty"),
])
def test_refused_uploads_are_400(fake: RunningFake, parts: tuple[tuple[str, bytes, str | None], ...],
                                 message: str) -> None:
    body, headers = multipart(*parts)
    response = httpx2.post(fake.url + "/files", content=body, headers=headers)
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert fake.state.files == {}


def test_a_cut_or_foreign_body_is_400(fake: RunningFake) -> None:
    body, headers = multipart(("purpose", b"user_data", None), ("file", IMAGE, "a.png"))
    cut = httpx2.post(fake.url + "/files", content=body[:1000], headers=headers)
    assert cut.status_code == 400 and "Malformed" in cut.json()["error"]["message"]
    as_json = httpx2.post(fake.url + "/files", json={"purpose": "user_data"},
                          headers={"authorization": f"Bearer {KEY}"})
    assert as_json.status_code == 400 and "multipart/form-data" in as_json.json()["error"]["message"]


def test_multipart_parts_come_back_byte_for_byte() -> None:
    body, headers = multipart(("purpose", b"user_data", None), ("file", IMAGE, "a.png"))
    purpose, file = parse_multipart(headers["content-type"], body)
    assert (purpose.name, purpose.data, purpose.filename) == ("purpose", b"user_data", None)
    assert (file.name, file.data, file.filename) == ("file", IMAGE, "a.png")


def test_unknown_paths_and_methods(fake: RunningFake) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    assert httpx2.get(fake.url + "/files/x/y/z", headers=auth).status_code == 404
    assert httpx2.get(fake.url + "/files/x/metadata", headers=auth).status_code == 404
    assert httpx2.put(fake.url + "/files/x", headers=auth).status_code == 405
    assert httpx2.post(fake.url + "/files/x/content", headers=auth).status_code == 405


def test_faults_apply(fake: RunningFake) -> None:
    with sdk(fake) as client:
        uploaded = client.files.create(file=("a.png", IMAGE, "image/png"), purpose="user_data")
        with pytest.raises(openai.InternalServerError):
            client.files.list(extra_headers={"x-fake-fault": "http_503"})
        with pytest.raises(openai.APIConnectionError):
            client.files.content(uploaded.id, extra_headers={"x-fake-fault": "reset_mid_stream"}).read()
    assert fake.state.requests[-1].outcome == "reset"
    assert 0 < len(fake.state.requests[-1].sent) < len(IMAGE)
