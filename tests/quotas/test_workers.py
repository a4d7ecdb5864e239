"""Limits under `server.workers = 2` on SQLite: the worker processes share nothing but the store, so budgets
are reserved in the store (limits.budgets "auto" picks it), and two workers never overspend."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import openai
import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.quotas.support import ask, key_subject, set_limits, usd

pytestmark = pytest.mark.slow  # chatgate with two worker processes


def test_two_worker_processes_share_one_budget(tmp_path: Path) -> None:
    db = tmp_path / "usage.db"
    store = f"sqlite:///{db}"
    secret = "sk-two-workers-0001"
    budget = usd("0.0004")
    set_limits(store, "key", key_subject(secret), budget_picousd=budget, budget_period="month")
    with run_fake_deepseek() as fake, spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store,
                                                     "--workers", "2",
                                                     env={"CHATGATE_LIMITS_CACHE_SECONDS": "0"}) as gate:
        statuses: list[int] = []

        def one(n: int) -> None:
            try:
                statuses.append(ask(gate.url, secret, n, max_tokens=32).http_response.status_code)
            except openai.RateLimitError as err:
                assert err.code == "insufficient_quota"
                statuses.append(429)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert statuses.count(200) >= 3 and statuses.count(429) >= 10, statuses
        deadline = time.monotonic() + 20
        while True:
            conn = sqlite3.connect(db)
            try:
                count, cost = conn.execute(
                    "SELECT count(*), coalesce(sum(cost_picousd), 0) FROM usage").fetchone()
            finally:
                conn.close()
            if count >= 60 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert count == 60
        assert cost <= budget, f"two workers spent {cost} of a {budget} budget"
