"""chatgate_budget_limit / _spent / _held (issue 51): a real chatgate in managed mode in front of the fake
DeepSeek, a key and its team with budgets, requests made with the SDK, then /metrics read: each budget's
series carry its scope, subject, period and currency, the limit as set, the spend as the usage records
add it up (in units of the currency), nothing held once the requests ended; a caller without a budget has
no series. Both budget keepers: in this process (local) and in the store, by leases (store)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatgate.gateway.auth import new_key
from chatgate.quotas.budgets import StoreBudgets
from chatgate.store.base import LimitRow
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import make_settings, run_chatgate
from tests.quotas.support import ask, usd

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


def scrape(url: str) -> Series:
    text = httpx2.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) if family.name.startswith("chatgate_budget_")
            for s in family.samples}


def labels(scope: str, subject: str, period: str, currency: str = "USD") -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"scope": scope, "subject": subject, "period": period, "currency": currency}.items()))


def recorded_cost(db: Path, key_id: str) -> int:
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT COALESCE(SUM(cost_picousd), 0) FROM usage WHERE key_id = ?",
                           (key_id,)).fetchone()
    finally:
        conn.close()
    return int(row[0])


@pytest.mark.parametrize("budgets", ["local", "store"])
def test_the_budget_gauges_show_each_budget_its_limit_and_its_spend(
        tmp_path: Path, fake: RunningFake, budgets: str) -> None:
    store = SQLiteStore(tmp_path / "usage.db")
    store.migrate()
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "admin_key": "a" * 40,
                                                       "upstream_api_key": "sk-upstream-account-01",
                                                       "key_cache_seconds": 0},
                             limits={"cache_seconds": 0, "budgets": budgets})
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "research", "notebook")
    free_id, free_secret, free_digest, free_prefix = new_key()
    store.create_key(free_id, free_digest, free_prefix, "open", "unlimited")
    now = time.time()
    store.set_limits(LimitRow("key", key_id, budget_picousd=usd("0.0004"), budget_period="day",
                              updated_at=now))
    store.set_limits(LimitRow("team", "research", budget_picousd=usd("2.5"), updated_at=now))
    with run_chatgate(settings, store=store) as gate:
        assert scrape(gate.url) == {}, "no budget is known before a caller with one came"
        ok = 0
        with pytest.raises(openai.RateLimitError):
            while ok < 200:
                ask(gate.url, secret, ok, max_tokens=32)
                ok += 1
        assert ok >= 3
        ask(gate.url, free_secret, 0)
        key, team = labels("key", key_id, "day"), labels("team", "research", "month")
        deadline = time.monotonic() + 10
        while True:  # the usage records are written off the hot path
            series, cost = scrape(gate.url), recorded_cost(tmp_path / "usage.db", key_id)
            spent = series.get(("chatgate_budget_spent", key))
            if (cost and spent == pytest.approx(cost / 1e12, abs=1e-15)) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if budgets == "store":  # the leases are given back once idle (~1 s): the spend stays shown
            leases = gate.state.quotas.budgets
            assert isinstance(leases, StoreBudgets)
            deadline = time.monotonic() + 10
            while leases.leases and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not leases.leases
            assert scrape(gate.url) == series
    assert 0 < cost <= usd("0.0004")
    assert series[("chatgate_budget_limit", key)] == pytest.approx(0.0004)
    assert series[("chatgate_budget_spent", key)] == pytest.approx(cost / 1e12, abs=1e-15)
    assert series[("chatgate_budget_held", key)] == 0
    assert series[("chatgate_budget_limit", team)] == pytest.approx(2.5)
    assert series[("chatgate_budget_spent", team)] == pytest.approx(cost / 1e12, abs=1e-15)
    assert series[("chatgate_budget_spent", key)] / series[("chatgate_budget_limit", key)] > 0.5
    subjects = {dict(labels_)["subject"] for _, labels_ in series}
    assert subjects == {key_id, "research"}, "only the subjects that have a budget have series"
