"""kill -9 while a request waits to be retried: every completed request keeps its one record (retried ones
included), and the request that never completed has none."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path

import httpx2
import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.metering.helpers import chat_body, complete, send_chat, sqlite_request_ids
from tests.metering.test_durability import restart_and_collect

pytestmark = pytest.mark.slow  # chatgate as a process, killed and started again

def test_kill9_during_a_retry_loses_no_record_of_a_completed_request(tmp_path: Path) -> None:
    db = tmp_path / "usage.db"
    once = {"x-fake-fault": "http_503", "x-fake-fault-attempts": "1"}
    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}") as cg:
            sent = [complete(cg.url, i, stream=i % 2 == 0, rid=f"retried-{i}", headers=once)
                    for i in range(6)]
            sent += [complete(cg.url, i, stream=i % 2 == 1, rid=f"plain-{i}") for i in range(4)]
            waiting = threading.Thread(target=lambda: _ignore_errors(cg.url), daemon=True)
            waiting.start()
            deadline = time.monotonic() + 10
            while not any(r.request_id == "stuck" for r in fake.state.requests):
                assert time.monotonic() < deadline, "the stuck request never reached the fake"
                time.sleep(0.02)
            time.sleep(0.2)  # chatgate is now waiting out Retry-After: 10 before its second attempt
            cg.kill9()
        assert [r.attempt for r in fake.state.requests if r.request_id == "stuck"] == [1]
        ids = restart_and_collect(tmp_path, fake.url, db, len(sent))
    assert Counter(ids) == Counter(sent), "missing or duplicated usage records after kill -9"
    assert "stuck" not in sqlite_request_ids(db)
    assert Counter(r.request_id for r in fake.state.requests if r.request_id.startswith("retried-")) == {
        f"retried-{i}": 2 for i in range(6)}


def _ignore_errors(url: str) -> None:
    faults = {"x-fake-fault": "http_503", "x-fake-fault-attempts": "9", "x-fake-retry-after": "10"}
    with contextlib.suppress(httpx2.HTTPError):  # the server is killed under it
        send_chat(url, chat_body(99), request_id="stuck", timeout=30, headers=faults)
