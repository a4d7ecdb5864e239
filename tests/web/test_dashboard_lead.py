"""The team lead's dashboard (issue 50): latency, errors by kind, spend forecast, the balance, a date range,
team and key filters, CSV export, charts sized to their data, a refusal's details where it was clicked, in
English and in Chinese with Beijing time; rendered by a real headless Chromium. The screenshots are kept in
tests/artifacts/; with CHATGATE_DOCS_IMAGES=1 they replace docs/images/dashboard-{en,zh}.png too."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.ci import missing
from tests.harness import REPO_ROOT
from tests.lifeline import die_with_parent
from tests.web.test_dashboard import chart_attrs, chromium_binary
from tests.web.traffic import ADMIN_KEY, BUDGETS, PLAN, Traffic, dashboard_traffic

pytestmark = pytest.mark.slow  # headless Chromium
IMAGES = REPO_ROOT / "docs" / "images"
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


def screenshot(tmp_path: Path, url: str, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / name
    render(tmp_path, url, f"--screenshot={shot}")
    assert shot.stat().st_size > 50_000
    if os.environ.get("CHATGATE_DOCS_IMAGES") == "1":
        shutil.copyfile(shot, IMAGES / name)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    with dashboard_traffic(tmp_path_factory.mktemp("lead")) as t:
        yield t


def render(tmp_path: Path, url: str, *args: str, tz: str = "Europe/Paris") -> tuple[str, str]:
    """The DOM after the page's scripts ran, and what Chromium logged (the page's console included)."""
    argv = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1800", "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0",
            *(args or ("--dump-dom",)), url]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, preexec_fn=die_with_parent(),
                          env={"TZ": tz, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def kept_refusals(traffic: Traffic) -> list[dict[str, Any]]:
    """The inspector writes its refusals in batches, off the request path: wait for all of them."""
    deadline = time.monotonic() + 10
    while len(kept := traffic.admin("/admin/refusals?limit=50").json()["data"]) < (
            traffic.rejected + traffic.upstream_refused):
        assert time.monotonic() < deadline, f"{len(kept)} refusals kept"
        time.sleep(0.05)
    return list(kept)


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and (
        "Uncaught" in line or "Refused to" in line or "Error" in line)]


def rows_of(dom: str, cls: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', m)) for m in re.findall(rf'<tr class="{cls}"[^>]*>', dom)]


# --- the JSON behind the new cards --------------------------------------------------------------------


def test_latency_per_model_over_the_answered_requests(traffic: Traffic) -> None:
    answer = traffic.admin("/admin/latency").json()
    by_model = {r["model"]: r for r in answer["by_model"]}
    planned: dict[str, int] = {}
    for _, _, model, ok, _ in PLAN:
        planned[model] = planned.get(model, 0) + ok
    assert {m: r["count"] for m, r in by_model.items()} == planned  # the refused and failed are not timed
    for row in by_model.values():
        assert 0 < row["p50_ms"] <= row["p95_ms"]
    research = traffic.admin("/admin/latency?team=research").json()["by_model"]
    assert {r["model"]: r["count"] for r in research} == {"deepseek-v4-pro": 3, "deepseek-flash": 4}
    assert traffic.admin("/admin/latency?since=nonsense").status_code == 400
    assert traffic.admin("/admin/latency", key=None).status_code == 401


def test_the_team_and_key_filters_select_the_records(traffic: Traffic) -> None:
    whole = traffic.admin("/admin/usage?by=team").json()["totals"]
    research = traffic.admin("/admin/usage?by=team&team=research").json()
    assert [r["team"] for r in research["rows"]] == ["research"]
    assert research["totals"]["requests"] == 3 + 4 + 1 + 1 < whole["requests"]  # DeepSeek refused one
    key_id = traffic.keys["helpdesk-bot"][0]
    bot = traffic.admin(f"/admin/usage/timeseries?by=model&bucket=hour&key={key_id}").json()
    assert sum(sum(s["requests"]) for s in bot["series"]) == 2 + 4 + 1  # ok, rejected, limited by the budget
    rejections = traffic.admin(f"/admin/rejections?key={key_id}").json()
    assert [o["key_id"] for o in rejections["top_offenders"]] == [key_id]
    assert traffic.admin("/admin/repairs?team=growth").json()["by_code"] == [
        {"code": "thinking_conflict", "count": 1}]
    later = traffic.admin(f"/admin/usage?by=team&since={int(traffic.finished) + 3600}").json()
    assert later["totals"]["requests"] == 0


# --- the page, rendered --------------------------------------------------------------------------------


def test_english_page_renders_every_new_card(traffic: Traffic, tmp_path: Path) -> None:
    kept = kept_refusals(traffic)
    one = next(r for r in kept if r["source"] == "chatgate")
    url = (f"{traffic.gate.url}/admin/dashboard?lang=en&tz=utc"
           f"#key={ADMIN_KEY}&bucket=hour&span=6&refusal={one['refusal_id']}")
    dom, log = render(tmp_path, url)
    assert 'data-state="ready"' in dom, dom[-3000:]
    assert console_errors(log) == [], console_errors(log)
    # latency per model
    latency = {r["data-model"]: r for r in rows_of(dom, "latency-row")}
    assert set(latency) == {model for _, _, model, _, _ in PLAN}
    assert all(float(r["data-p50"]) <= float(r["data-p95"]) for r in latency.values())
    # errors by kind, each request once
    kinds = chart_attrs(dom, "chart-errors")["data-kinds"].replace("&quot;", '"')
    assert json.loads(kinds) == {"rejected": traffic.rejected, "limited": 1, "upstream_refused": 1,
                                 "upstream_failed": 1}
    # the balance: managed mode asks DeepSeek (here the fake's account)
    assert 'id="balance" data-state="ready"' in dom
    assert "<dt>balance (USD)</dt><dd>$110.00</dd>" in dom
    # the spend forecast: research's budget is a month's, about half used; support's is "total" (no forecast)
    budgets = {r["data-team"]: r for r in rows_of(dom, "budget-row")}
    assert float(budgets["research"]["data-forecast"]) >= float(budgets["research"]["data-spent"]) > 0
    assert budgets["support"]["data-forecast"] == ""
    assert BUDGETS["support"]["budget_period"] == "total"
    # CSV of what is shown: every series' buckets, then latency
    link = re.search(r'<a id="csv"[^>]*href="data:text/csv;charset=utf-8,([^"]+)"[^>]*data-rows="(\d+)"', dom)
    assert link, "no CSV link"
    table = list(csv.DictReader(io.StringIO(urllib.parse.unquote(link.group(1).replace("&amp;", "&")))))
    assert len(table) == int(link.group(2))
    usage = [r for r in table if r["section"] == "usage"]
    assert {r["by"] for r in usage} == {"team", "key", "model"} and {len(usage) % 6} == {0}
    by_team = [r for r in usage if r["by"] == "team"]
    assert sum(int(r["requests"]) for r in by_team) == traffic.requests
    assert sum(int(r["rejected"]) for r in by_team) == traffic.rejected
    assert {r["group"] for r in table if r["section"] == "latency"} == set(latency)
    # charts sized to their data: six hour buckets are not stretched across a wide card
    widths = [int(w) for w in re.findall(r'<svg[^>]*class="sized"[^>]*data-width="(\d+)"', dom)]
    assert widths and max(widths) <= 640
    cache_svg = re.search(r'id="chart-cache-team"[^>]*><svg[^>]*data-width="(\d+)"', dom)
    assert cache_svg and int(cache_svg.group(1)) == 90 + 48 * 6
    # the refusal's details open in a row right below its own
    opened = re.search(r'<tr data-refusal="([^"]+)" class="refusal-open">.*?</tr><tr class="detail-row" '
                       r'data-refusal="([^"]+)"><td colspan="8"><pre id="refusal-detail">([^<]*)', dom, re.S)
    assert opened, "the details are not next to the refusal's row"
    assert opened.group(1) == opened.group(2) == one["refusal_id"]
    assert opened.group(3).startswith(f"{one['request_id']}  400 by chatgate")
    # times in UTC, as asked (the browser's zone is Paris)
    assert "time (UTC)" in dom
    assert dt.datetime.fromtimestamp(one["ts"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S") in dom
    screenshot(tmp_path, url.replace(f"&refusal={one['refusal_id']}", ""), "dashboard-en.png")


def test_chinese_page_in_beijing_time(traffic: Traffic, tmp_path: Path) -> None:
    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout if shutil.which(
        "fc-list") else ""
    if not fonts.strip():
        missing("no CJK font: Chromium would draw the Chinese as boxes (scripts/install-test-tools.sh)")
    kept = kept_refusals(traffic)
    url = f"{traffic.gate.url}/admin/dashboard?lang=zh&tz=utc8#key={ADMIN_KEY}&bucket=hour&span=6"
    dom, log = render(tmp_path, url)
    assert 'data-state="ready"' in dom, dom[-3000:]
    assert console_errors(log) == []
    assert '<html lang="zh-CN">' in dom and "<title>chatgate 用量</title>" in dom
    for text in ("各模型延迟", "按类型统计的错误", "DeepSeek 余额", "各团队预算与花费预测", "最近的拒绝",
                 "<span>请求数</span>", "<span>被规则拒绝</span>", "时间\uff08UTC+8\uff09", "导出 CSV",
                 "无预算"):
        assert text in dom, text
    status = re.search(r'<p id="status" role="status">([^<]*)</p>', dom)
    assert status and "时间为 UTC+8" in status.group(1), status
    beijing = dt.timezone(dt.timedelta(hours=8))
    assert dt.datetime.fromtimestamp(kept[0]["ts"], beijing).strftime("%Y-%m-%d %H:%M:%S") in dom
    assert "Latency per model" not in dom and "Recent refusals" not in dom
    screenshot(tmp_path, url, "dashboard-zh.png")


def test_filters_and_a_date_range_from_the_link(traffic: Traffic, tmp_path: Path) -> None:
    today = dt.datetime.fromtimestamp(traffic.started, dt.UTC).strftime("%Y-%m-%d")
    url = (f"{traffic.gate.url}/admin/dashboard?tz=utc&team=research"
           f"#key={ADMIN_KEY}&bucket=hour&from={today}&to={today}")
    dom, _ = render(tmp_path, url)
    assert 'data-state="ready"' in dom, dom[-3000:]
    assert chart_attrs(dom, "chart-tokens-team")["data-series"] == "1"
    assert chart_attrs(dom, "chart-tokens-key")["data-series"] == "2"  # alice-laptop and ci-evals
    tiles = dict((label, value) for value, label in re.findall(
        r'<div class="total"><b>([^<]*)</b><span>([^<]*)</span></div>', dom))
    assert tiles["requests"] == "9"
    assert f"{today} to {today}" in dom and "only research" in dom
    cache_svg = re.search(r'id="chart-tokens-team"[^>]*><svg[^>]*data-width="(\d+)"', dom)
    assert cache_svg and int(cache_svg.group(1)) == 640  # 24 hour buckets: the full width


def test_yuan_are_shown_with_the_yuan_sign(tmp_path: Path) -> None:
    """pricing.currency = CNY: the costs on the page are in yuan, with ¥ (never $)."""
    from tests.fakes.server import run_fake_deepseek
    from tests.harness import make_settings, run_chatgate
    from tests.web.traffic import wait_recorded

    with run_fake_deepseek() as fake:
        settings = make_settings(tmp_path, fake.url, auth={"admin_key": ADMIN_KEY},
                                 pricing={"currency": "CNY"})
        with run_chatgate(settings) as gate:
            for _ in range(3):
                resp = httpx2.post(f"{gate.url}/v1/chat/completions", timeout=10, json={
                    "model": "deepseek-flash", "messages": [{"role": "user", "content": "你好"}]},
                    headers={"authorization": "Bearer sk-test-client-0001"})
                assert resp.status_code == 200, resp.text
            wait_recorded(Traffic(gate, ok=3), 3)
            page = f"{gate.url}/admin/dashboard?lang=zh#key={ADMIN_KEY}&bucket=hour&span=2"
            dom, log = render(tmp_path, page)
    assert 'data-state="ready"' in dom, dom[-3000:]
    assert console_errors(log) == []
    tiles = dict((label, value) for value, label in re.findall(
        r'<div class="total"><b>([^<]*)</b><span>([^<]*)</span></div>', dom))
    cost = tiles["费用\uff08CNY\uff09"]
    assert cost.startswith("¥") and cost != "¥0", tiles
    assert "$" not in "".join(tiles.values())
    assert re.search(r"¥0\.0\d+", dom)  # the chart's axis and legend too
