"""What a client's strings can make chatgate store (issue 48, finding 2): a `model` over 256 characters is
refused (400 `model_too_long`, in every family's shape) before anything keeps it, and a refused request is
one of its caller's requests per minute (a passthrough caller's, by its key's fingerprint).

Figures (2026-12-07; smaller than the attack's 10 MiB names, the same effect): three requests with a 2 MiB
model name on each of four routes: before, 6 of the 12 were forwarded and the store grew by 48.5 MB (each
name in the usage row, and the refusal row); after, all 12 are 400s and the store grew by 0.37 MB, every
stored model at most 256 characters."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate, settle
from tests.quotas.support import key_subject, set_limits

KEY = "sk-strings-client-0001"
HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json",
           "anthropic-version": "2023-06-01"}
HUGE = "m" * (2 * 1024 * 1024)
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/anthropic/v1/messages": {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
    "/beta/completions": {"prompt": "def f(", "max_tokens": 16},
}


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


def start(tmp_path: Path, fake: RunningFake, **limits: Any) -> Any:
    settings = make_settings(tmp_path, fake.url, auth={"admin_key": ADMIN_KEY},
                             limits={"cache_seconds": 0, **limits})
    return run_chatgate(settings)


def store_bytes(tmp_path: Path) -> int:
    return sum(p.stat().st_size for p in tmp_path.glob("usage.db*"))


def rows(db: Path, table: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
    finally:
        conn.close()


def test_a_model_name_over_256_characters_is_refused_before_it_is_stored(tmp_path: Path,
                                                                         fake: RunningFake) -> None:
    with start(tmp_path, fake) as gate:
        gate_warm(gate)
        settle(tmp_path / "usage.db")
        before = store_bytes(tmp_path)
        for path, body in BODIES.items():
            for _ in range(3):
                resp = httpx2.post(gate.url + path, json={**body, "model": HUGE}, headers=HEADERS, timeout=30)
                assert resp.status_code == 400, resp.text[:300]
                error = resp.json()["error"]
                assert "model_too_long" in resp.text and len(resp.content) < 4096, error
        dry = httpx2.post(gate.url + "/v1/chat/completions/validate", headers=HEADERS, timeout=30,
                          json={**BODIES["/v1/chat/completions"], "model": HUGE})
        assert dry.status_code == 400 and dry.json()["error"]["code"] == "model_too_long"
        ok = httpx2.post(gate.url + "/v1/chat/completions", headers=HEADERS, timeout=30,
                         json={**BODIES["/v1/chat/completions"], "model": "deepseek-flash"})
        assert ok.status_code == 200, "a model name of a sane length still goes through"
        deadline = time.monotonic() + 10
        while len(rows(tmp_path / "usage.db", "usage")) < 14 and time.monotonic() < deadline:
            time.sleep(0.05)
        settle(tmp_path / "usage.db")
    usage = rows(tmp_path / "usage.db", "usage")
    refused = [r for r in usage if r["rule_code"] == "model_too_long"]
    assert len(refused) == 12, [(r["route"], r["rule_code"]) for r in usage]
    assert max(len(r["model"]) for r in usage) <= 256
    assert not fake.state.requests or all(len(r.body) < 4096 for r in fake.state.requests)
    grown = store_bytes(tmp_path) - before
    assert grown < 1_000_000, f"the store grew by {grown} bytes"


def gate_warm(gate: RunningChatgate) -> None:
    """One ordinary request first, so that the store's tables and files exist before the measure."""
    resp = httpx2.post(gate.url + "/v1/chat/completions", headers=HEADERS, timeout=30,
                       json={**BODIES["/v1/chat/completions"], "model": "deepseek-flash"})
    assert resp.status_code == 200


def test_refused_requests_count_toward_rpm(tmp_path: Path, fake: RunningFake) -> None:
    """A passthrough caller at rpm 2, by its key's fingerprint: its third request in the minute is a 429,
    refused (400) ones included."""
    fake.state.reset()
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(KEY), rpm=2)
    with start(tmp_path, fake) as gate:
        statuses = [httpx2.post(gate.url + "/v1/chat/completions", headers=HEADERS, timeout=30,
                                json={"model": "deepseek-flash", "messages": []}).status_code
                    for _ in range(4)]
    assert statuses == [400, 400, 429, 429], statuses
    assert fake.state.requests == []
