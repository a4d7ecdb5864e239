"""The fake DeepSeek's tool APIs themselves, over real loopback HTTP with httpx2: what the tool routes' tests
rely on (answers, billed shapes, DeepSeek's 400s, keep-alives)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek

KEY = "sk-tools-0001"


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


def post(fake: RunningFake, tool: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(f"{fake.url}/v1/tools/{tool}", content=orjson.dumps(body), timeout=10, headers={
        "authorization": f"Bearer {KEY}", "content-type": "application/json", **headers})


def test_search_finds_count_results_or_none(fake: RunningFake) -> None:
    assert len(post(fake, "search", {"query": "deepseek", "count": 4}).json()["results"]) == 4
    assert post(fake, "search", {"query": "nothing here"}).json()["results"] == []
    for body in ({"query": "q" * 129}, {"query": "q", "count": 51}, {"count": 3}):
        refused = post(fake, "search", body)
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"


def test_fetch_reads_markdown_and_refuses_a_long_url(fake: RunningFake) -> None:
    assert post(fake, "fetch", {"url": "https://example.com/a"}).json()["content"].startswith("# A page")
    assert post(fake, "fetch", {"url": "https://example.com/empty"}).json()["content"] == ""
    assert post(fake, "fetch", {"url": "u" * 8193}).status_code == 400


def test_ocr_sends_keepalives_then_one_page_per_form_feed(fake: RunningFake) -> None:
    document = ("a.pdf", b"1\f2\f3\f4", "application/pdf")
    resp = httpx2.post(f"{fake.url}/v1/tools/ocr", files={"file": document},
                       data={"purpose": "text_recognition"}, timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "x-fake-keepalives": "2"})
    assert resp.content.startswith(b"\n\n") and len(orjson.loads(resp.content)["pages"]) == 4
    missing = httpx2.post(f"{fake.url}/v1/tools/ocr", files={"other": ("a", b"x")}, timeout=10,
                          headers={"authorization": f"Bearer {KEY}"})
    assert missing.status_code == 400


def test_tts_answers_audio_and_asr_text(fake: RunningFake) -> None:
    audio = post(fake, "tts", {"input": "hi"})
    assert audio.headers["content-type"] == "audio/mpeg" and audio.content == b"ID3\x04fakehi"
    text = httpx2.post(f"{fake.url}/v1/tools/asr", files={"file": ("a.wav", b"RIFF1234")}, timeout=10,
                       headers={"authorization": f"Bearer {KEY}"})
    assert text.json() == {"text": "8 bytes of speech"}


def test_the_tools_need_a_key_and_take_faults(fake: RunningFake) -> None:
    fake.state.configure(valid_keys=["sk-other"])
    assert post(fake, "search", {"query": "q"}).status_code == 401
    fake.state.configure(valid_keys=None)
    assert post(fake, "search", {"query": "q"}, **{"x-fake-fault": "http_503"}).status_code == 503
