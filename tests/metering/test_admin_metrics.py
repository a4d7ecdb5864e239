"""GET /admin/usage (admin key only, same numbers as the CLI) and GET /metrics (Prometheus text)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.metering.helpers import chat_body, cli, send_chat, usage_json, wait_for

ROUTE = "/v1/chat/completions"


@dataclass
class Served:
    cg: RunningChatgate
    fake: RunningFake
    store: str
    db: Path
    split_ts: float


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("admin")
    with run_fake_deepseek() as fake:
        settings = make_settings(tmp, fake.url, auth={"admin_key": ADMIN_KEY})
        with run_chatgate(settings) as cg:
            for i in range(3):
                assert send_chat(cg.url, chat_body(i), "sk-ops-1").status_code == 200
                assert send_chat(cg.url, chat_body(i, stream=True, model="deepseek-v4-pro"), "sk-ops-2"
                                 ).status_code == 200
            empty = {"model": "deepseek-flash", "messages": []}
            assert send_chat(cg.url, empty, "sk-ops-1").status_code == 400
            time.sleep(0.05)
            split = time.time()
            time.sleep(0.05)
            resp = send_chat(cg.url, chat_body(4), "sk-ops-2", headers={"x-fake-fault": "http_503"})
            assert resp.status_code == 503
            assert send_chat(cg.url, chat_body(5, stream=True), "sk-ops-1").status_code == 200
            wait_for(lambda: _count(tmp / "usage.db") == 9, what="9 records stored")
            yield Served(cg, fake, f"sqlite:///{tmp}/usage.db", tmp / "usage.db", split)


def _count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM usage").fetchone()[0])


def admin_get(served: Served, auth: str | None, **params: str) -> httpx2.Response:
    headers = {"authorization": auth} if auth else {}
    return httpx2.get(served.cg.url + "/admin/usage", params=params, headers=headers, timeout=10)


def test_admin_usage_needs_the_admin_key(served: Served) -> None:
    for auth in (None, "Bearer sk-ops-1", f"Bearer {ADMIN_KEY}x", f"Basic {ADMIN_KEY}", ADMIN_KEY):
        resp = admin_get(served, auth)
        assert resp.status_code == 401, auth
        error = resp.json()["error"]
        assert error["type"] == "authentication_error" and "admin" in error["message"].lower()
        assert "rows" not in resp.json()


@pytest.mark.slow  # the CLI as a process, for each grouping
@pytest.mark.parametrize("by", ["key", "team", "model", "day", "rule"])
def test_admin_usage_equals_the_cli(served: Served, by: str) -> None:
    resp = admin_get(served, f"Bearer {ADMIN_KEY}", by=by)
    assert resp.status_code == 200
    assert resp.json() == usage_json(served.store, by)
    assert resp.json()["totals"]["requests"] == 9


@pytest.mark.slow  # the CLI as two processes
def test_admin_usage_filters_match_the_cli(served: Served) -> None:
    split = str(served.split_ts)
    since = admin_get(served, f"Bearer {ADMIN_KEY}", by="key", since=split).json()
    assert since == usage_json(served.store, "key", "--since", split)
    assert since["totals"]["requests"] == 2 and since["totals"]["rejected"] == 0
    until = admin_get(served, f"Bearer {ADMIN_KEY}", by="model", until=split).json()
    assert until == usage_json(served.store, "model", "--until", split)
    assert until["totals"]["requests"] == 7 and until["totals"]["rejected"] == 1


def test_admin_usage_bad_filter_is_400(served: Served) -> None:
    for params in ({"by": "colour"}, {"since": "last tuesday"}):
        resp = admin_get(served, f"Bearer {ADMIN_KEY}", **params)
        assert resp.status_code == 400, params
        assert resp.json()["error"]["type"] == "invalid_request_error"
    assert cli("usage", "--by", "key", "--store", served.store).returncode == 0


def metrics(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx2.get(served.cg.url + "/metrics", timeout=10)
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def sample(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def records(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM usage")]
    finally:
        conn.close()


def test_metrics_count_requests_by_route_status_and_model(served: Served) -> None:
    m = metrics(served)
    assert sample(m, "chatgate_requests_total", route=ROUTE, status="200", model="deepseek-flash") == 4
    assert sample(m, "chatgate_requests_total", route=ROUTE, status="200", model="deepseek-v4-pro") == 3
    assert sample(m, "chatgate_requests_total", route=ROUTE, status="400", model="deepseek-flash") == 1
    assert sample(m, "chatgate_requests_total", route=ROUTE, status="503", model="deepseek-flash") == 1
    assert sample(m, "chatgate_rejections_total", code="empty_array") == 1


def test_metrics_tokens_and_cost_match_the_records(served: Served) -> None:
    m = metrics(served)
    recs = [r for r in records(served.db) if r["outcome"] != "rejected"]
    kinds = {"prompt": "prompt_tokens", "completion": "completion_tokens",
             "cache_hit": "prompt_cache_hit_tokens", "cache_miss": "prompt_cache_miss_tokens",
             "reasoning": "reasoning_tokens"}
    for model in ("deepseek-flash", "deepseek-v4-pro"):
        mine = [r for r in recs if r["model"] == model]
        for kind, column in kinds.items():
            expected = sum(r[column] for r in mine)
            assert expected > 0
            assert sample(m, "chatgate_tokens_total", kind=kind, model=model, team="default") == expected
        cost = sum(r["cost_picousd"] for r in mine) / 1e12
        assert sample(m, "chatgate_cost_usd_total", model=model, team="default") == pytest.approx(cost)


def test_metrics_latency_and_ttfb_histograms(served: Served) -> None:
    m = metrics(served)
    forwarded = [r for r in records(served.db) if r["outcome"] != "rejected"]
    for model in ("deepseek-flash", "deepseek-v4-pro"):
        n = sum(r["model"] == model for r in forwarded)
        assert sample(m, "chatgate_upstream_latency_seconds_count", model=model) == n
        assert sample(m, "chatgate_time_to_first_byte_seconds_count", model=model) == n
        assert sample(m, "chatgate_upstream_latency_seconds_bucket", model=model, le="+Inf") == n
        assert sample(m, "chatgate_upstream_latency_seconds_sum", model=model) > 0


def test_metrics_count_requests_refused_before_a_record(served: Served) -> None:
    """A 415 (not JSON) is refused before the handler makes a usage record; /metrics still counts it."""
    before = sample(metrics(served), "chatgate_requests_total", route=ROUTE, status="415", model="")
    resp = httpx2.post(served.cg.url + ROUTE, content=b"hello", headers={"content-type": "text/plain"})
    assert resp.status_code == 415
    after = sample(metrics(served), "chatgate_requests_total", route=ROUTE, status="415", model="")
    assert after == before + 1
