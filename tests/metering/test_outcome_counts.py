"""Every request counted under what became of it (issue 50, item 4): refused by a rule of chatgate's,
limited by one of its limits (rpm, budget), refused by DeepSeek (its 400), failed at DeepSeek (a 503 after
the retries, a body cut off). A real chatgate in front of the fake DeepSeek; what each record holds, then
what `chatgate usage` (JSON, CSV, table) and `GET /admin/usage` say of it."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.metering.reports import render_table
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.metering.helpers import chat_body, cli, send_chat, usage_json
from tests.quotas.support import key_subject, set_limits

OK, RULE, RPM, BUDGET, DS400, DS503, CUT = (
    "sk-counts-ok-0001", "sk-counts-rule-0002", "sk-counts-rpm-0003", "sk-counts-budget-0004",
    "sk-counts-ds400-0005", "sk-counts-ds503-0006", "sk-counts-cut-0007")
# what each caller's requests became: (status chatgate answered, outcome, rule_code, upstream_status)
EXPECTED = {
    OK: [(200, "ok", None, 200)] * 2,
    RULE: [(400, "rejected", "empty_array", None)],
    RPM: [(200, "ok", None, 200), (429, "limited", "rpm:key", None)],
    BUDGET: [(429, "limited", "budget:key", None)],
    DS400: [(400, "upstream_error", None, 400)],
    DS503: [(503, "upstream_error", None, 503)],  # after chatgate's 3 attempts
    CUT: [(502, "upstream_failed", None, None)],  # half a body, then the connection dropped
}
# each caller's counters: requests, rejected, limited, upstream_refused, upstream_failed
COUNTS = {OK: (2, 0, 0, 0, 0), RULE: (1, 1, 0, 0, 0), RPM: (2, 0, 1, 0, 0), BUDGET: (1, 0, 1, 0, 0),
          DS400: (1, 0, 0, 1, 0), DS503: (1, 0, 0, 0, 1), CUT: (1, 0, 0, 0, 1)}
NAMES = ("requests", "rejected", "limited", "upstream_refused", "upstream_failed")


@dataclass
class Served:
    gate: RunningChatgate
    fake: RunningFake
    tmp: Path
    records: list[dict[str, Any]]

    @property
    def store(self) -> str:
        return f"sqlite:///{self.tmp}/usage.db"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("counts")
    with run_fake_deepseek() as fake:
        settings = make_settings(tmp, fake.url, auth={"admin_key": ADMIN_KEY}, limits={"cache_seconds": 0},
                                 upstream={"retries": 2, "retry_base_ms": 1})
        store = f"sqlite:///{tmp}/usage.db"
        set_limits(store, "key", key_subject(RPM), rpm=1)
        set_limits(store, "key", key_subject(BUDGET), budget_picousd=1, budget_period="total")
        with run_chatgate(settings) as gate:
            sent: dict[str, list[int]] = {}

            def send(key: str, body: dict[str, Any], fault: str | None = None) -> None:
                headers = {"x-fake-fault": fault, "x-fake-fault-attempts": "99"} if fault else {}
                sent.setdefault(key, []).append(send_chat(gate.url, body, key, headers=headers).status_code)

            send(OK, chat_body(1))
            send(OK, chat_body(2, stream=True))
            send(RULE, {"model": "deepseek-flash", "messages": []})
            send(RPM, chat_body(3))
            send(RPM, chat_body(4))
            send(BUDGET, chat_body(5))
            send(DS400, chat_body(6, model="deepseek-v4-pro"), "http_400")
            send(DS503, chat_body(7), "http_503")
            send(CUT, chat_body(8), "reset_mid_stream")
            assert sent == {key: [status for status, *_ in what] for key, what in EXPECTED.items()}
            records = usage_rows(tmp, sum(len(v) for v in EXPECTED.values()))
            yield Served(gate, fake, tmp, records)


def test_each_record_says_what_became_of_its_request(served: Served) -> None:
    """What the records hold: the outcome, the rule or limit that refused it, DeepSeek's status."""
    held: dict[str, list[tuple[int, str, str | None, int | None]]] = {}
    for r in served.records:
        key = next(k for k in EXPECTED if key_subject(k) == r["key_id"])
        held.setdefault(key, []).append((0, r["outcome"], r["rule_code"], r["upstream_status"]))
    assert {k: sorted(v[1:] for v in rows) for k, rows in held.items()} == {
        k: sorted(v[1:] for v in rows) for k, rows in EXPECTED.items()}


def _counts(row: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(row[name]) for name in NAMES)


def test_usage_by_key_counts_each_outcome_apart(served: Served) -> None:
    report = usage_json(served.store, "key")
    rows = {r["key_id"]: r for r in report["rows"]}
    assert {k: _counts(rows[key_subject(k)]) for k in EXPECTED} == COUNTS
    assert _counts(report["totals"]) == (9, 1, 2, 1, 2)


def test_usage_by_model_shows_what_deepseek_refused(served: Served) -> None:
    rows = {r["model"]: r for r in usage_json(served.store, "model")["rows"]}
    assert _counts(rows["deepseek-v4-pro"]) == (1, 0, 0, 1, 0)
    assert _counts(rows["deepseek-flash"]) == (8, 1, 2, 0, 2)


def test_usage_by_rule_groups_refusals_by_rule_and_limits_by_limit(served: Served) -> None:
    rows = {r["rule_code"]: _counts(r) for r in usage_json(served.store, "rule")["rows"]}
    assert rows == {"empty_array": (1, 1, 0, 0, 0), "rpm:key": (1, 0, 1, 0, 0), "budget:key": (1, 0, 1, 0, 0),
                    "": (6, 0, 0, 1, 2)}  # '' : no rule or limit refused them (answered, or DeepSeek's)


def test_usage_csv_and_table_carry_the_counts(served: Served) -> None:
    out = cli("usage", "--by", "team", "--format", "csv", "--store", served.store).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[-1]["team"] == "TOTAL" and _counts(rows[-1]) == (9, 1, 2, 1, 2)
    table = cli("usage", "--by", "team", "--store", served.store).stdout.splitlines()
    assert table[0].split()[:6] == ["team", "requests", "rejected", "limited", "ds_refused", "ds_failed"]
    total = next(line for line in table if line.startswith("TOTAL"))  # notes may follow it
    assert total.split()[:6] == ["TOTAL", "9", "1", "2", "1", "2"]
    assert max(len(line) for line in table) <= 120


def test_admin_usage_is_the_same_report(served: Served) -> None:
    resp = httpx2.get(served.gate.url + "/admin/usage?by=key",
                      headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    assert resp.status_code == 200
    body = resp.json()
    assert body == usage_json(served.store, "key")
    assert _counts(body["totals"]) == (9, 1, 2, 1, 2)


def test_the_table_by_team_fits_120_columns_for_a_busy_month() -> None:
    counters = {"requests": 1_234_567, "rejected": 12_345, "limited": 123_456, "upstream_refused": 1_234,
                "upstream_failed": 123, "prompt_tokens": 987_654_321, "completion_tokens": 98_765_432,
                "cache_hit_rate": 0.512345, "cost_usd": 999.123456, "cache_saved_usd": 99.123456}
    report = {"group_by": "team", "currency": "USD", "rows": [{"team": "platform", **counters}],
              "totals": dict(counters)}
    lines = render_table(report).splitlines()
    assert max(len(line) for line in lines) <= 120, "\n".join(lines)
    assert lines[0].split() == ["team", "requests", "rejected", "limited", "ds_refused", "ds_failed",
                                "input", "output", "hit%", "cost_usd", "saved_usd"]
