"""The usage dashboard: admin-only JSON behind it, and the page rendered by a real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.ci import missing
from tests.harness import REPO_ROOT, make_settings, run_chatgate
from tests.lifeline import die_with_parent
from tests.web.traffic import ADMIN_KEY, BUDGETS, PLAN, Traffic, dashboard_traffic

pytestmark = pytest.mark.slow  # headless Chromium

ARTIFACTS = REPO_ROOT / "tests" / "artifacts"


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    with dashboard_traffic(tmp_path_factory.mktemp("dashboard")) as t:
        yield t


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    missing("Chromium is not installed (scripts/install-test-tools.sh installs it)")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1400", "--virtual-time-budget=10000", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, preexec_fn=die_with_parent())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def chart_attrs(dom: str, chart_id: str) -> dict[str, str]:
    match = re.search(rf'<div[^>]*id="{chart_id}"[^>]*>', dom)
    assert match, f"{chart_id} not in the page"
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(0)))


# --- the JSON endpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/admin/usage/timeseries?by=team", "/admin/rejections", "/admin/repairs"])
def test_dashboard_data_needs_the_admin_key(traffic: Traffic, path: str) -> None:
    client_secret = traffic.keys["alice-laptop"][1]
    assert traffic.admin(path, key=None).status_code == 401
    assert traffic.admin(path, key=client_secret).status_code == 401  # a client key is not an admin key
    refused = traffic.admin(path, key="wrong-admin-key")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_admin_key"


def test_timeseries_by_team_per_day_adds_up_to_the_usage_report(traffic: Traffic) -> None:
    """Buckets end at the traffic's own day (`until` just after it), whenever this test runs."""
    until = int(traffic.finished) + 1
    series = traffic.admin(f"/admin/usage/timeseries?by=team&bucket=day&until={until}").json()
    report = traffic.admin("/admin/usage?by=team").json()
    day = time.strftime("%Y-%m-%d", time.gmtime(traffic.started))
    assert len(series["buckets"]) == 14 and series["buckets"][-1] == day
    by_team = {s["label"]: s for s in series["series"]}
    assert set(by_team) == {"research", "support", "growth"}
    for row in report["rows"]:
        s = by_team[row["team"]]
        assert s["tokens"][-1] == row["prompt_tokens"] + row["completion_tokens"] > 0
        assert s["tokens"][:-1] == [0] * 13  # all traffic happened on that day
        assert s["requests"][-1] == row["requests"]
        for name in ("rejected", "limited", "upstream_refused", "upstream_failed"):
            assert s[name][-1] == row[name], (row["team"], name)
        assert s["total_cost_usd"] == pytest.approx(row["cost_usd"], abs=1e-9)


def test_timeseries_by_key_and_model_per_hour(traffic: Traffic) -> None:
    span = f"since={int(traffic.started) - 3 * 3600}&until={int(traffic.finished) + 1}"
    by_key = traffic.admin(f"/admin/usage/timeseries?by=key&bucket=hour&{span}").json()
    traffic_hour = time.strftime("T%H:00Z", time.gmtime(traffic.started))
    assert len(by_key["buckets"]) == 4 and by_key["buckets"][-1].endswith(traffic_hour)
    assert {s["label"] for s in by_key["series"]} == {name for _, name, *_ in PLAN}
    assert all(s["key_id"] == traffic.keys[s["label"]][0] for s in by_key["series"])
    by_model = traffic.admin(f"/admin/usage/timeseries?by=model&bucket=hour&{span}").json()
    assert {s["label"] for s in by_model["series"]} == {model for *_, model, _, _ in PLAN}
    model_tokens = sum(s["total_tokens"] for s in by_model["series"])
    assert model_tokens == sum(s["total_tokens"] for s in by_key["series"])


@pytest.mark.parametrize("query", ["by=day", "by=team&bucket=week", "by=team&since=the-day-before",
                                   "by=team&bucket=hour&since=0", "by=team&since=nan", "by=team&until=inf",
                                   "by=team&bucket=hour&since=-1e18"])
def test_timeseries_rejects_bad_parameters_with_400(traffic: Traffic, query: str) -> None:
    resp = traffic.admin(f"/admin/usage/timeseries?{query}")
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_repairs_by_code(traffic: Traffic) -> None:
    assert traffic.repaired == len(PLAN)  # every key sent one request that needed thinking_conflict
    assert traffic.admin("/admin/repairs").json() == {
        "by_code": [{"code": "thinking_conflict", "count": traffic.repaired}]}


def test_rejections_by_rule_code_and_top_offenders(traffic: Traffic) -> None:
    body = traffic.admin("/admin/rejections").json()
    assert {r["code"]: r["count"] for r in body["by_rule"] if r["kind"] == "rule"} == traffic.rejected_codes
    assert {r["code"]: r["count"] for r in body["by_rule"] if r["kind"] == "limit"} == traffic.limited_codes
    offenders = body["top_offenders"]
    assert [o["key_name"] for o in offenders] == ["helpdesk-bot", "copywriter", "ci-evals"]
    assert [(o["rejected"], o["limited"]) for o in offenders] == [(4, 1), (2, 0), (1, 0)]
    assert offenders[0]["team"] == "support" and offenders[0]["requests"] == 7


def test_usage_totals_count_every_outcome(traffic: Traffic) -> None:
    totals = traffic.admin("/admin/usage?by=team").json()["totals"]
    assert (totals["requests"], totals["rejected"], totals["limited"], totals["upstream_refused"],
            totals["upstream_failed"]) == (traffic.requests, traffic.rejected, 1, 1, 1)


def test_teams_budget_use_matches_the_usage_report(traffic: Traffic) -> None:
    """What the Budgets card draws: each team's budget, the period's spend (here: all the traffic) and what
    is left."""
    teams = {t["team"]: t for t in traffic.admin("/admin/teams").json()["data"]}
    assert list(teams) == ["default", "growth", "research", "support"]
    cost = {r["team"]: r["cost_usd"] for r in traffic.admin("/admin/usage?by=team").json()["rows"]}
    research, support = teams["research"], teams["support"]
    assert (research["limits"]["budget_usd"], research["spend"]["period"]) == (0.0006, "month")
    assert research["spend"]["spent_usd"] == pytest.approx(cost["research"], abs=1e-12)
    assert 0 < research["spend"]["spent_usd"] < 0.0006
    assert research["spend"]["remaining_usd"] == pytest.approx(0.0006 - cost["research"], abs=1e-12)
    assert research["spend"]["used_percent"] == round(100 * research["spend"]["spent_usd"] / 0.0006, 2)
    assert (support["limits"]["budget_usd"], support["spend"]["period"]) == (0.000001, "total")
    assert support["spend"]["remaining_usd"] == 0 and support["spend"]["used_percent"] > 100
    growth = teams["growth"]
    assert growth["limits"]["budget_usd"] is None and growth["spend"]["remaining_usd"] is None
    assert teams["growth"]["spend"]["spent_usd"] == pytest.approx(cost["growth"], abs=1e-12)
    assert [teams[t]["key_count"] for t in teams] == [0, 1, 2, 1]


def budget_row(dom: str, team: str) -> dict[str, str]:
    match = re.search(rf'<tr[^>]*data-team="{team}"[^>]*>', dom)
    assert match, f"no budget row for {team}"
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(0)))


# --- the page ----------------------------------------------------------------------------


def test_page_is_static_and_locked_down(traffic: Traffic) -> None:
    """The page carries no data (served without a key) and may only run its own script."""
    page = httpx2.get(traffic.gate.url + "/admin/dashboard", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "helpdesk-bot" not in page.text and "research" not in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
    script = httpx2.get(traffic.gate.url + "/admin/dashboard/dashboard.js", timeout=10)
    assert script.status_code == 200 and "sessionStorage" in script.text
    assert "http" not in script.text.replace("http://www.w3.org/2000/svg", "")
    assert httpx2.get(traffic.gate.url + "/admin/dashboard/settings.py", timeout=10).status_code == 404


def test_headless_chromium_renders_every_chart(traffic: Traffic, tmp_path: Path) -> None:
    url = f"{traffic.gate.url}/admin/dashboard#key={ADMIN_KEY}&bucket=hour&span=6"
    dom = chromium(tmp_path, "--dump-dom", url).stdout
    assert 'data-state="ready"' in dom, dom[:3000]
    expected = {"team": 3, "key": 4, "model": 3}
    for by, n in expected.items():
        for metric in ("tokens", "cost"):
            attrs = chart_attrs(dom, f"chart-{metric}-{by}")
            assert attrs["data-series"] == str(n), (by, metric, attrs)
            assert float(attrs["data-total"]) > 0
    assert chart_attrs(dom, "chart-tokens-team")["data-total"] == str(
        sum(s["total_tokens"] for s in traffic.admin("/admin/usage/timeseries?by=team").json()["series"]))
    rejections = chart_attrs(dom, "chart-rejections")
    assert rejections["data-series"] == str(len(traffic.rejected_codes) + len(traffic.limited_codes))
    assert rejections["data-total"] == str(traffic.rejected + sum(traffic.limited_codes.values()))
    tiles = dict((label, value) for value, label in re.findall(
        r'<div class="total"><b>([^<]*)</b><span>([^<]*)</span></div>', dom))
    assert tiles["requests"] == str(traffic.requests) and tiles["rejected by a rule"] == str(traffic.rejected)
    assert (tiles["limited (429)"], tiles["refused by DeepSeek (4xx)"],
            tiles["failed at DeepSeek (5xx, no answer)"]) == ("1", "1", "1")
    repairs = chart_attrs(dom, "chart-repairs")
    assert (repairs["data-series"], repairs["data-total"]) == ("1", str(traffic.repaired))
    assert dom.count('class="bar"') >= 3 + 4 + 3 + len(traffic.rejected_codes) + 1
    assert "helpdesk-bot" in dom and "tool_without_tool_calls" in dom
    assert ADMIN_KEY not in dom  # the fragment is dropped from the URL and never shown
    budgets = chart_attrs(dom, "budgets")
    assert (budgets["data-rows"], budgets["data-budgets"]) == ("4", str(len(BUDGETS)))
    teams = {t["team"]: t for t in traffic.admin("/admin/teams").json()["data"]}
    for team, entry in teams.items():
        row = budget_row(dom, team)
        spend = entry["spend"]
        assert float(row["data-spent"]) == pytest.approx(spend["spent_usd"], abs=1e-12), team
        if team in BUDGETS:
            assert float(row["data-budget"]) == float(BUDGETS[team]["budget_usd"])
            assert row["data-period"] == BUDGETS[team]["budget_period"]
            assert float(row["data-percent"]) == spend["used_percent"]
            assert float(row["data-remaining"]) == pytest.approx(spend["remaining_usd"], abs=1e-12)
        else:
            assert row["data-budget"] == row["data-percent"] == row["data-remaining"] == "", team
    fills = re.findall(r'<span class="meter-fill( \w+)?"[^>]*data-width="([\d.]+)"', dom)
    assert sorted(fills) == sorted([("", str(teams["research"]["spend"]["used_percent"])), (" over", "100")])
    assert "no budget" in dom and "renews" in dom
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", url)
    assert shot.stat().st_size > 20_000


def test_headless_chromium_lists_the_recent_refusals_and_opens_one_by_its_link(traffic: Traffic,
                                                                             tmp_path: Path) -> None:
    deadline = time.monotonic() + 10  # the inspector writes its refusals in batches, off the request path
    refused = traffic.rejected + traffic.upstream_refused  # chatgate's and DeepSeek's 400s
    while len(kept := traffic.admin("/admin/refusals?limit=50").json()["data"]) < refused:
        assert time.monotonic() < deadline, f"{len(kept)} of {refused} refusals kept"
        time.sleep(0.05)
    assert len(kept) == refused  # every refused request of the traffic, each with its request id
    one = next(r["request_id"] for r in kept if r["source"] == "chatgate")  # DeepSeek's has no rule marks
    dom = chromium(tmp_path, "--dump-dom",
                   f"{traffic.gate.url}/admin/dashboard#key={ADMIN_KEY}&refusal={one}").stdout
    assert 'data-state="ready"' in dom, dom[:3000]
    table = chart_attrs(dom, "refusals")
    assert table["data-rows"] == str(len(kept))
    links = re.findall(r'<a href="#refusal=([^"]+)" class="refusal-link">([^<]+)</a>', dom)
    assert sorted(text for _, text in links) == sorted(r["request_id"] for r in kept)
    detail = re.search(r'<pre id="refusal-detail">(.*?)</pre>', dom, re.S)
    assert detail, "the refusal of the link is not shown"
    shown = traffic.admin(f"/admin/refusals/{one}").json()
    assert detail.group(1).startswith(f"{one}  400 by chatgate") and "&lt;--" in detail.group(1)
    assert shown["problems"][0]["message"].split("'")[0] in detail.group(1)


def test_headless_chromium_with_a_wrong_key_shows_the_refusal(traffic: Traffic, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", f"{traffic.gate.url}/admin/dashboard#key=not-the-admin-key").stdout
    assert 'data-state="error"' in dom
    assert "admin key was refused" in dom
    assert 'data-series="' not in dom  # nothing drawn


def test_dashboard_data_is_503_when_metering_is_off(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, store={"url": "none"}, auth={"admin_key": ADMIN_KEY})
    with run_chatgate(settings) as gate:
        for path in ("/admin/usage/timeseries?by=team", "/admin/rejections", "/admin/repairs"):
            resp = httpx2.get(gate.url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_store"
        assert httpx2.get(gate.url + "/admin/dashboard", timeout=10).status_code == 200


def test_no_admin_key_configured_is_not_a_refused_key(tmp_path: Path) -> None:
    """Issue 50 item 6: with auth.admin_key unset the admin API says so (403 admin_key_not_configured, naming
    CHATGATE_ADMIN_KEY and how to make one), whatever is sent, and the page says it instead of "refused"."""
    with run_chatgate(make_settings(tmp_path)) as gate:
        for path in ("/admin/usage/timeseries?by=team", "/admin/teams", "/admin/keys", "/admin/usage"):
            for headers in ({}, {"authorization": "Bearer some-guess-at-a-key-0000000000000000"}):
                resp = httpx2.get(gate.url + path, headers=headers, timeout=10)
                error = resp.json()["error"]
                assert (resp.status_code, error["code"]) == (403, "admin_key_not_configured"), resp.text
                assert "CHATGATE_ADMIN_KEY" in error["message"] and "openssl rand -hex 32" in error["message"]
        for fragment in ("", "#key=any-key-at-all"):
            dom = chromium(tmp_path / f"c{len(fragment)}", "--dump-dom",
                           f"{gate.url}/admin/dashboard{fragment}").stdout
            assert 'data-state="error"' in dom, dom[-2000:]
            assert "No admin key is configured on this chatgate: set CHATGATE_ADMIN_KEY" in dom
            assert "refused" not in dom.split('id="status"', 1)[1].split("<", 1)[0]
