"""What a misbehaving upstream can make chatgate hold (issue 48, finding 11): one stream line or JSON body
over limits.max_upstream_bytes ends the answer with an error in the family's shape and a usage record; a
stream meter keeps at most TEXT_KEPT of text; the estimate of a long text is bounded in time (its bytes,
beyond limits.count_tokens_exact_bytes). The fake DeepSeek misbehaves on request (`x-fake-huge-line`,
`x-fake-endless`).

Figures (2026-12-07, smaller than the attack's 32-96 MiB line): a 4 MiB line with a limit of 256 KiB:
before, relayed whole (the client got a 4 MiB line); after, the stream ends with `upstream_too_large` and
chatgate held at most the limit of it. An openai meter fed 24 MiB of content: before, 24 MiB kept; after,
8 MiB."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import orjson
import pytest

from chatgate.openai.stream import ChatStreamMeter
from chatgate.sse import TEXT_KEPT
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate, make_settings, run_chatgate

LIMIT = 256 * 1024
HEADERS = {"authorization": "Bearer sk-upstream-bounds", "content-type": "application/json"}
BODY = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[RunningChatgate, RunningFake]]:
    with run_fake_deepseek() as fake, run_chatgate(make_settings(
            tmp_path, fake.url, limits={"max_upstream_bytes": LIMIT})) as running:
        yield running, fake


def test_a_stream_line_over_the_limit_ends_the_stream_with_an_error_and_a_record(
        gate: tuple[RunningChatgate, RunningFake], tmp_path: Path) -> None:
    running, _ = gate
    with httpx2.stream("POST", running.url + "/v1/chat/completions", timeout=30,
                       content=orjson.dumps({**BODY, "stream": True}),
                       headers={**HEADERS, "x-fake-huge-line": str(4 * 1024 * 1024)}) as resp:
        assert resp.status_code == 200
        received = b"".join(resp.iter_raw())
    assert len(received) < LIMIT, "the long line was not relayed"
    assert b"upstream_too_large" in received and received.rstrip().endswith(b"}")
    row, = usage_rows(tmp_path, 1)
    assert row["outcome"] == "upstream_failed"


def test_a_json_body_over_the_limit_is_a_502_with_a_record(gate: tuple[RunningChatgate, RunningFake],
                                                           tmp_path: Path) -> None:
    running, _ = gate
    resp = httpx2.post(running.url + "/v1/chat/completions", content=orjson.dumps(BODY), timeout=30,
                       headers={**HEADERS, "x-fake-huge-line": str(1024 * 1024)})
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_too_large"
    row, = usage_rows(tmp_path, 1)
    assert row["outcome"] == "upstream_failed"


def test_an_endless_stream_is_relayed_and_estimated_from_a_bounded_text(
        gate: tuple[RunningChatgate, RunningFake], tmp_path: Path) -> None:
    running, _ = gate
    endless = 12 * 1024 * 1024
    t0 = time.monotonic()
    with httpx2.stream("POST", running.url + "/v1/chat/completions", timeout=60,
                       content=orjson.dumps({**BODY, "stream": True}),
                       headers={**HEADERS, "x-fake-endless": str(endless)}) as resp:
        size = sum(len(chunk) for chunk in resp.iter_raw())
    assert size > endless
    row, = usage_rows(tmp_path, 1, timeout=60)
    assert row["tokens_exact"] == 0 and row["completion_tokens"] >= TEXT_KEPT // 2
    assert time.monotonic() - t0 < 60


def test_a_meter_keeps_at_most_text_kept() -> None:
    meter = ChatStreamMeter()
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"z" * 65536 + b'"}}]}\n\n'
    for _ in range(3 * TEXT_KEPT // 65536):
        meter.feed(event)
    meter.finish()
    assert TEXT_KEPT - 65536 <= len(meter.text) <= TEXT_KEPT
