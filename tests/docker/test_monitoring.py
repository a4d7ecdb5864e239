"""docker/monitoring/: the Grafana dashboard and the Prometheus alert rules query only metrics and labels
that chatgate's /metrics really serves: chatgate runs in this process (managed mode, two DeepSeek accounts,
a team with a spent budget, which the budget gauges show) in front of the fake DeepSeek, takes a few
requests, and its /metrics is read."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chatgate.gateway.auth import new_key
from chatgate.store.base import LimitRow
from chatgate.store.sqlite import SQLiteStore
from tests.ci import missing
from tests.fakes.server import run_fake_deepseek
from tests.harness import REPO_ROOT, make_settings, run_chatgate

try:
    import promql_parser
except ImportError:  # pragma: no cover - in the test extras
    promql_parser = None

FOLDER = REPO_ROOT / "docker" / "monitoring"
DASHBOARD = FOLDER / "grafana-dashboard.json"
ALERTS = FOLDER / "prometheus-alerts.yaml"
# Labels Prometheus adds to every scraped series (the target's), and a histogram's bucket bound.
TARGET_LABELS = {"instance", "job", "le"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("_count", "_sum", "_created"), "info": ("_info",)}


def dashboard_exprs() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in data["templating"]["list"] if v["type"] == "query"]
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h", "$instance": ".*",
                     "$team": ".*"}


def promql(expr: str) -> Any:
    """The expression parsed (Grafana's variables replaced as Grafana does); a syntax error raises."""
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    if promql_parser is None:
        missing("promql-parser is not installed (in the test extras)")
    return promql_parser.parse(expr)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every selector, plus the labels of by/without/on/ignoring
    (under the name ""); `label_values(metric, label)`, Grafana's, is read as a selector of that label."""
    values = re.fullmatch(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*(\w+)\s*\)", expr.strip())
    if values:
        return [(values.group(1), {values.group(2)})]
    found: list[tuple[str, set[str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name or "", {m.name for m in node.matchers.matchers} - {"__name__"}))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            found.append(("", set(node.modifier.labels)))
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            found.append(("", set(matching.labels) if matching is not None else set()))

    promql_parser.walk(promql(expr), visit)
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], dict[str, set[str]]]]:
    """What /metrics serves after a few requests: {sample name: family type}, {sample name: label names}."""
    tmp = tmp_path_factory.mktemp("monitoring")
    mp = pytest.MonkeyPatch()
    mp.setenv("DEEPSEEK_KEY_ONE", "sk-account-one-0001")
    mp.setenv("DEEPSEEK_KEY_TWO", "sk-account-two-0002")
    try:
        store = SQLiteStore(tmp / "usage.db")
        accounts = [{"name": n, "key_env": f"DEEPSEEK_KEY_{n.upper()}"} for n in ("one", "two")]
        with run_fake_deepseek() as fake:
            settings = make_settings(tmp, fake.url, auth={"mode": "managed", "admin_key": "a" * 40,
                                                          "key_cache_seconds": 0},
                                     upstream={"accounts": accounts}, limits={"cache_seconds": 0})
            with run_chatgate(settings, store=store) as gate:
                _id, paying, digest, prefix = new_key()
                store.create_key(_id, digest, prefix, "search", "crawler")
                _id2, broke, digest2, prefix2 = new_key()
                store.create_key(_id2, digest2, prefix2, "broke", "intern")
                store.set_limits(LimitRow("team", "broke", budget_picousd=1, budget_period="month",
                                          updated_at=time.time()))
                url = gate.url + "/v1/chat/completions"
                body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
                for secret, extra, expected in [(paying, {}, 200), (paying, {"stream": True}, 200),
                                                (paying, {"messages": []}, 400), (broke, {}, 429),
                                                ("cg-unknown", {}, 401)]:
                    resp = httpx2.post(url, json={**body, **extra}, timeout=30,
                                       headers={"authorization": f"Bearer {secret}"})
                    assert resp.status_code == expected, (extra, resp.status_code, resp.text[:200])
                deadline = time.monotonic() + 10
                while True:
                    text = httpx2.get(gate.url + "/metrics", timeout=10).text
                    if "chatgate_usage_records_written_total" in text or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
    finally:
        mp.undo()
    kinds: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            kinds[family.name + suffix] = family.type
        for sample in family.samples:
            kinds.setdefault(sample.name, family.type)
            labels.setdefault(sample.name, set()).update(sample.labels)
    yield kinds, labels


def test_the_files_are_well_formed() -> None:
    data = json.loads(DASHBOARD.read_text())
    assert data["uid"] and data["title"] and data["schemaVersion"] >= 30
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"].strip()
    titles = " ".join(p["title"].lower() for p in data["panels"])
    for topic in ("requests", "errors", "latency", "tokens", "cost per team", "cache hit rate", "retries",
                  "budget", "usage writer"):
        assert topic in titles, topic
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {"ChatgateBudgetSpent", "ChatgateBudgetNearItsEnd", "ChatgateTeamSpendSpike",
            "ChatgateUpstreamErrors", "ChatgateAccountSetAside", "ChatgateUsageWriterDropping"} <= names
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
        assert not re.search(r"^\d+$", str(rule.get("for", "1m"))), "for: needs a unit"


def test_every_metric_and_label_queried_is_served(served: tuple[dict[str, str], dict[str, set[str]]]) -> None:
    kinds, labels = served
    exprs = dashboard_exprs() + [r["expr"] for r in alert_rules()]
    unknown, bad_labels = set(), set()
    for expr in exprs:
        found = selectors(expr)
        metrics = {name for name, _ in found if name}
        assert metrics, f"queries no metric: {expr}"
        unknown |= metrics - set(kinds)
        if all(m in labels for m in metrics):  # a family with no sample yet shows no labels
            known = set().union(*(labels[m] for m in metrics)) | TARGET_LABELS
            used = set().union(*(names for _, names in found))
            bad_labels |= {f"{name} in {sorted(metrics)}" for name in used - known}
    assert not unknown, f"not in chatgate's /metrics: {sorted(unknown)}"
    assert not bad_labels, f"labels chatgate does not set: {sorted(bad_labels)}"


def test_the_requests_made_the_series_the_alerts_watch(served: tuple[dict[str, str], dict[str, set[str]]]
                                                       ) -> None:
    """Not only the families: the requests above produced the samples (with their labels) that the
    budget, upstream, account and writer alerts read (the budget gauges: the team "broke" refused)."""
    _kinds, labels = served
    for name in ("chatgate_limited_total", "chatgate_upstream_attempts_total", "chatgate_cost_usd_total",
                 "chatgate_upstream_account_available", "chatgate_usage_records_written_total",
                 "chatgate_rejections_total", "chatgate_tokens_total", "chatgate_auth_failures_total",
                 "chatgate_upstream_latency_seconds_bucket", "chatgate_budget_limit", "chatgate_budget_spent",
                 "chatgate_budget_held"):
        assert name in labels, name
    assert labels["chatgate_limited_total"] == {"limit"}
    for name in ("chatgate_budget_limit", "chatgate_budget_spent", "chatgate_budget_held"):
        assert labels[name] == {"scope", "subject", "period", "currency"}, name
    assert labels["chatgate_upstream_account_available"] == {"account"}


def test_the_check_sees_an_unknown_metric_a_label_and_bad_syntax() -> None:
    expr = 'sum by (team, model) (rate(chatgate_nope_total{kind=~"cache_.*",a!="b"}[$__rate_interval]))'
    assert selectors(expr) == [("", {"team", "model"}), ("chatgate_nope_total", {"kind", "a"})]
    assert selectors("x / on (team) group_left y") == [("", {"team"}), ("x", set()), ("y", set())]
    assert selectors("label_values(chatgate_tokens_total, team)") == [("chatgate_tokens_total", {"team"})]
    with pytest.raises(ValueError):
        promql("sum by (team (rate(chatgate_requests_total[5m]))")


def test_the_docs_name_the_files() -> None:
    text = (REPO_ROOT / "docs" / "production.md").read_text()
    assert "docker/monitoring/grafana-dashboard.json" in text
    assert "docker/monitoring/prometheus-alerts.yaml" in text
