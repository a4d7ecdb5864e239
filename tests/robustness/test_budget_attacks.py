"""Budgets under attack (issue 48, findings 1, 3 and 4): what DeepSeek bills beyond a body's bytes (an
uploaded document a file part names, images however their JSON is spelt) is reserved before a request is
admitted, and counted when a client hangs up before DeepSeek's usage came. chatgate in managed mode in
front of the fake DeepSeek, which bills documents and images as DeepSeek does (`bill_media`); the openai SDK
as the client.

Figures (2026-12-07, the smaller scale of these tests): a $0.10 budget and 8 concurrent requests naming a
200 KB document: before, all 8 admitted and ~$0.24-0.48 spent; after, the spend stays within the budget."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import new_key
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.quotas.support import set_limits, usd

UPSTREAM = "sk-upstream-budget-attack"
DOCUMENT = b"Quarterly figures, line by line. " * 6_000  # ~200 KB of text: 200K tokens billed per mention


@pytest.fixture(scope="module")
def fake_server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(fake_server: RunningFake) -> Iterator[RunningFake]:
    fake_server.state.reset()
    fake_server.state.configure(bill_media=True)
    yield fake_server
    assert fake_server.state.wait_idle(10)
    fake_server.state.reset()


class Team:
    def __init__(self, gate: RunningChatgate, store: SQLiteStore, db: Path) -> None:
        self.gate, self.db = gate, db
        key_id, self.secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gate.url + "/v1", api_key=self.secret, max_retries=0, timeout=30)

    def spent(self, count: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 10
        while True:
            conn = sqlite3.connect(self.db)
            conn.row_factory = sqlite3.Row
            try:
                rows = [dict(r) for r in conn.execute("SELECT * FROM usage ORDER BY ts")]
            finally:
                conn.close()
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)


@pytest.fixture
def team(tmp_path: Path, fake: RunningFake) -> Iterator[Team]:
    db = tmp_path / "usage.db"
    store = SQLiteStore(db)
    store.migrate()
    set_limits(f"sqlite:///{db}", "team", "search", budget_picousd=usd("0.10"), budget_period="month")
    settings = make_settings(tmp_path, fake.url, limits={"cache_seconds": 0}, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "admin_key": ADMIN_KEY, "key_cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        yield Team(gate, store, db)


def concurrently(count: int, ask: Any) -> list[Any]:
    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def one(i: int) -> None:
        start.wait()
        try:
            results[i] = ask()
        except openai.APIStatusError as error:
            results[i] = error.status_code
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_a_file_part_reserves_the_documents_tokens(team: Team, fake: RunningFake) -> None:
    with team.sdk() as client:
        file_id = client.files.create(file=("report.txt", DOCUMENT, "text/plain"), purpose="user_data").id
        messages: Any = [{"role": "user", "content": [
            {"type": "text", "text": "Summarise this."}, {"type": "file", "file": {"file_id": file_id}}]}]
        results = concurrently(8, lambda: client.chat.completions.create(
            model="deepseek-flash", messages=messages, max_tokens=16))
    admitted = [r for r in results if not isinstance(r, int)]
    assert admitted, "one request fits the budget"
    assert all(r == 429 for r in results if isinstance(r, int)), results
    rows = team.spent(8)
    spent = sum(r["cost_picousd"] for r in rows)
    assert max(r["prompt_tokens"] for r in rows) > len(DOCUMENT), "the fake billed the document"
    assert spent <= usd("0.10"), f"${Decimal(spent) / 10**12} spent of a $0.10 budget"


def test_escaped_images_are_reserved(team: Team, fake: RunningFake) -> None:
    """`"\\u0069mage_url"` is `"image_url"` once parsed: 600 of them, a $0.10 budget (issue 48 #3)."""
    image = b'{"type":"\\u0069mage_url","\\u0069mage_url":{"url":"https://example.com/a.png"}}'
    body = (b'{"model":"deepseek-flash","max_tokens":16,"messages":[{"role":"user","content":['
            + b",".join([image] * 300) + b"]}]}")
    headers = {"authorization": f"Bearer {team.secret}", "content-type": "application/json"}

    def ask() -> int:
        return httpx2.post(team.gate.url + "/v1/chat/completions", content=body, headers=headers,
                           timeout=30).status_code
    results = concurrently(8, ask)
    assert 200 in results and set(results) <= {200, 429}, results
    rows = team.spent(8)
    assert max(r["prompt_tokens"] for r in rows) >= 300 * 384
    assert sum(r["cost_picousd"] for r in rows) <= usd("0.10")


def test_a_hang_up_is_estimated_with_its_document_and_images(team: Team, fake: RunningFake) -> None:
    with team.sdk() as client:
        file_id = client.files.create(file=("notes.md", DOCUMENT, "text/markdown"), purpose="user_data").id
    body = orjson.dumps({"model": "deepseek-flash", "stream": True, "max_tokens": 16, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Read these."},
                                     {"type": "file", "file": {"file_id": file_id}},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]})
    headers = {"authorization": f"Bearer {team.secret}", "content-type": "application/json",
               "x-fake-chunk-delay": "0.3"}
    with httpx2.stream("POST", team.gate.url + "/v1/chat/completions", content=body, headers=headers,
                       timeout=30) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())  # then hang up, long before DeepSeek's usage
    rows = team.spent(1)
    assert [r["outcome"] for r in rows] == ["client_disconnected"]
    assert rows[0]["prompt_tokens"] >= len(DOCUMENT) + 384, rows[0]
