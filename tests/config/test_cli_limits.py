"""`chatgate teams set|list` and `chatgate keys create|set|list` with limits, as their own processes, on
SQLite and PostgreSQL: flags merged (`none` clears), exact USD, spend and what is left, exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatgate.quotas.periods import period_start
from chatgate.store import open_store
from chatgate.store.base import LimitRow, UsageRecord
from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.metering.helpers import chat_body, cli, send_chat
from tests.pgutil import fresh_database

pytestmark = pytest.mark.slow  # the CLI as processes, a running server

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'limits.db'}"
    else:
        with fresh_database() as url:
            yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'limits.db'}"


def limits_of(store_url: str, scope: str, subject: str) -> LimitRow | None:
    store = open_store(store_url)
    try:
        store.migrate()
        return store.get_limits(scope, subject)
    finally:
        store.close()


def teams_json(store_url: str) -> dict[str, dict[str, Any]]:
    proc = cli("teams", "list", "--format", "json", "--store", store_url)
    document = json.loads(proc.stdout)
    assert document["object"] == "list"
    return {t["team"]: t for t in document["data"]}


def keys_json(store_url: str) -> dict[str, dict[str, Any]]:
    proc = cli("keys", "list", "--format", "json", "--store", store_url)
    return {k["id"]: k for k in json.loads(proc.stdout)["data"]}


def create(store_url: str, team: str, name: str, *flags: str) -> tuple[str, str, list[str]]:
    """(key_id, secret, stdout lines) of `chatgate keys create`."""
    lines = cli("keys", "create", "--team", team, "--name", name, *flags, "--store", store_url
                ).stdout.strip().splitlines()
    key_id = next(w for line in lines for w in line.split() if w.startswith("key_"))
    return key_id, lines[-1], lines


# --- teams ---------------------------------------------------------------------------------------


def test_teams_set_changes_only_the_flags_given_and_none_clears(store_url: str) -> None:
    out = cli("teams", "set", "search", "--budget-usd", "12.345678901234", "--rpm", "60",
              "--store", store_url)
    assert out.stdout.strip() == ("team search: budget_usd=12.345678901234 budget_period=month rpm=60 "
                                  "tpm=none max_concurrent=none")
    assert limits_of(store_url, "team", "search") == LimitRow(
        "team", "search", 12_345_678_901_234, "month", 60, None, None,
        limits_of(store_url, "team", "search").updated_at)  # type: ignore[union-attr]
    out = cli("teams", "set", "search", "--tpm", "90000", "--max-concurrent", "4", "--budget-period", "week",
              "--store", store_url)
    assert out.stdout.strip() == ("team search: budget_usd=12.345678901234 budget_period=week rpm=60 "
                                  "tpm=90000 max_concurrent=4")
    out = cli("teams", "set", "search", "--rpm", "none", "--budget-usd", "none", "--store", store_url)
    assert out.stdout.strip() == ("team search: budget_usd=none budget_period=none rpm=none tpm=90000 "
                                  "max_concurrent=4")
    assert cli("teams", "set", "search", "--store", store_url).stdout.strip().endswith("max_concurrent=4")
    cli("teams", "set", "search", "--tpm", "none", "--max-concurrent", "NONE", "--store", store_url)
    assert limits_of(store_url, "team", "search") is None  # nothing left: the row is gone
    out = cli("teams", "set", "default", "--budget-usd", "0.5", "--budget-period", "total",
              "--store", store_url)
    assert "budget_usd=0.5 budget_period=total" in out.stdout
    assert limits_of(store_url, "team", "default").budget_picousd == 500_000_000_000  # type: ignore[union-attr]


def test_a_budget_in_yuan_from_the_cli(store_url: str, tmp_path: Path) -> None:
    """--budget-cny (issue 46 §4): the budget's currency is kept; teams list, in a CNY deployment, shows the
    spend in yuan."""
    out = cli("teams", "set", "research", "--budget-cny", "300", "--store", store_url)
    assert out.stdout.strip() == ("team research: budget_cny=300 budget_period=month rpm=none tpm=none "
                                  "max_concurrent=none")
    assert limits_of(store_url, "team", "research").budget_currency == "CNY"  # type: ignore[union-attr]
    config = tmp_path / "cny.toml"
    config.write_text('[pricing]\ncurrency = "CNY"\n')
    header, *rows = cli("teams", "list", "--config", str(config), "--store", store_url).stdout.splitlines()
    assert header.split()[7:9] == ["spent_cny", "remaining_cny"]
    assert any(r.split()[:3] == ["research", "0", "300"] and "CNY" in r for r in rows)
    bad = cli("teams", "set", "research", "--budget-cny", "abc", "--store", store_url, check=False)
    assert bad.returncode == 2 and "--budget-cny" in bad.stderr


def usage(team: str, key_id: str, ts: float, cost_usd: str) -> UsageRecord:
    from decimal import Decimal

    return UsageRecord(record_id=f"r-{team}-{key_id}-{ts}", ts=ts, request_id="req", key_id=key_id,
                       key_name=key_id, team=team, model="deepseek-flash", route="/v1/chat/completions",
                       stream=False, outcome="ok", cost_picousd=int(Decimal(cost_usd) * 10**12))


def test_teams_list_shows_limits_spend_and_what_is_left(store_url: str) -> None:
    key_id, _, _ = create(store_url, "ops", "pager")
    cli("teams", "set", "search", "--budget-usd", "10", "--rpm", "600", "--store", store_url)
    now = time.time()
    month = period_start(now, "month")
    store = open_store(store_url)
    store.migrate()
    store.insert_usage([usage("search", "key_a", now - 5, "1.25"), usage("search", "key_b", now - 3, "0.25"),
                        usage("search", "key_a", month - 10, "7"),  # last month's: not this period's
                        usage("ops", key_id, now - 1, "0.125")])
    store.close()
    teams = teams_json(store_url)
    assert list(teams) == ["default", "ops", "search"]
    search, ops = teams["search"], teams["ops"]
    assert search["limits"] == {"budget_usd": 10, "budget_period": "month", "rpm": 600, "tpm": None,
                                "max_concurrent": None}
    assert search["key_count"] == 0 and ops["key_count"] == 1 and teams["default"]["key_count"] == 0
    assert search["spend"]["spent_usd"] == 1.5 and search["spend"]["remaining_usd"] == 8.5
    assert search["spend"]["used_percent"] == 15 and search["spend"]["period_start"] == month
    assert ops["spend"]["spent_usd"] == 0.125 and ops["spend"]["remaining_usd"] is None  # no budget
    table = cli("teams", "list", "--store", store_url).stdout.splitlines()
    assert table[0].split() == ["team", "keys", "budget_usd", "period", "rpm", "tpm", "concurrent",
                                "spent_usd", "remaining_usd", "used", "since"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["search"] == ["search", "0", "10", "month", "600", "-", "-", "1.5", "8.5", "15%",
                              time.strftime("%Y-%m-01", time.gmtime(now))]
    assert rows["ops"][:9] == ["ops", "1", "-", "-", "-", "-", "-", "0.125", "-"]
    assert rows["default"][:3] == ["default", "0", "-"]


# --- keys ----------------------------------------------------------------------------------------


def test_keys_create_and_set_with_limits(store_url: str) -> None:
    key_id, secret, lines = create(store_url, "search", "crawler", "--budget-usd", "25", "--max-concurrent",
                                   "2")
    assert secret.startswith("cg-") and "\n".join(lines).count(secret) == 1
    assert lines[0] == "limits: budget_usd=25 budget_period=month rpm=none tpm=none max_concurrent=2"
    assert lines[1].startswith(f"created key {key_id} (team search, name crawler)")
    out = cli("keys", "set", key_id, "--rpm", "30", "--budget-usd", "none", "--store", store_url).stdout
    assert out.strip() == (f"key {key_id} (team search, name crawler): budget_usd=none budget_period=none "
                           "rpm=30 tpm=none max_concurrent=2")
    fp = "fp-0123456789ab"
    out = cli("keys", "set", fp, "--tpm", "1000", "--store", store_url).stdout
    assert out.strip() == (f"key {fp} (passthrough, team default): budget_usd=none budget_period=none "
                           "rpm=none tpm=1000 max_concurrent=none")
    plain_id, plain_secret, plain_lines = create(store_url, "ops", "pager")
    assert len(plain_lines) == 2  # no limits: the output is what it always was
    keys = keys_json(store_url)
    assert list(keys) == [key_id, plain_id, fp]
    assert keys[key_id]["limits"] == {"budget_usd": None, "budget_period": None, "rpm": 30, "tpm": None,
                                      "max_concurrent": 2}
    assert keys[fp]["kind"] == "passthrough" and keys[fp]["limits"]["tpm"] == 1000
    table = cli("keys", "list", "--store", store_url).stdout
    for text in (table, json.dumps(keys)):
        assert secret not in text and plain_secret not in text
    header, *rows = table.splitlines()
    assert header.split() == ["key_id", "name", "team", "prefix", "budget_usd", "period", "rpm", "tpm",
                              "concurrent", "created"]  # "revoked" only when a key is
    by_id = {r.split()[0]: r.split() for r in rows}
    assert by_id[key_id][4:9] == ["-", "-", "30", "-", "2"]
    assert by_id[plain_id][4:9] == ["-"] * 5
    assert by_id[fp][:9] == [fp, fp, "default", "-", "-", "-", "-", "1000", "-"]


def test_keys_set_on_an_unknown_key_is_exit_1(sqlite_url: str) -> None:
    for key_id in ("key_doesnotexist", "crawler", "fp-nothex"):
        proc = cli("keys", "set", key_id, "--rpm", "5", "--store", sqlite_url, check=False)
        assert proc.returncode == 1, proc
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and f"no key {key_id}" in proc.stderr
        assert proc.stdout == ""
    assert limits_of(sqlite_url, "key", "key_doesnotexist") is None


BAD = [
    (["--rpm", "-1"], "--rpm"),
    (["--tpm", "1.5"], "--tpm"),
    (["--max-concurrent", "many"], "--max-concurrent"),
    (["--rpm", "99999999999999999999"], "--rpm"),
    (["--budget-usd", "ten"], "--budget-usd"),
    (["--budget-usd", "-5"], "--budget-usd"),
    (["--budget-usd", "0.0000000000001"], "--budget-usd"),
    (["--budget-usd", "NaN"], "--budget-usd"),
    (["--budget-usd", "1e9"], "--budget-usd"),
    (["--budget-period", "year"], "--budget-period"),
    (["--budget-period", "week"], "--budget-period"),  # a period needs a budget
]


@pytest.mark.parametrize(("flags", "flag"), BAD)
@pytest.mark.parametrize("command", [["teams", "set", "search"], ["keys", "set", "fp-0123456789ab"],
                                     ["keys", "create", "--team", "search", "--name", "n"]])
def test_a_bad_value_is_exit_2_with_one_line_and_changes_nothing(sqlite_url: str, command: list[str],
                                                                 flags: list[str], flag: str) -> None:
    proc = cli(*command, *flags, "--store", sqlite_url, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"chatgate: {flag}: "), proc.stderr
    assert proc.stdout == ""
    store = open_store(sqlite_url)
    store.migrate()
    assert store.list_limits("team") == [] and store.list_limits("key") == [] and store.list_keys() == []
    store.close()


def test_a_bad_team_name_is_exit_2(sqlite_url: str) -> None:
    for command in (["teams", "set", " padded", "--rpm", "1"],
                    ["keys", "create", "--team", "", "--name", "n"]):
        proc = cli(*command, "--store", sqlite_url, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith("chatgate: team: "), proc.stderr


def test_a_limit_set_with_the_cli_reaches_a_running_server(tmp_path: Path) -> None:
    """Another process (the CLI) changes the store: the server applies it within limits.cache_seconds."""
    store = f"sqlite:///{tmp_path}/shared.db"
    env = {"DEEPSEEK_API_KEY": "sk-house", "CHATGATE_LIMITS_CACHE_SECONDS": "0.3"}
    key_id, secret, _ = create(store, "search", "crawler")
    with run_fake_deepseek() as fake, spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store,
                                                     "--auth", "managed", env=env) as gate:
        assert send_chat(gate.url, chat_body(1), key=secret).status_code == 200
        cli("teams", "set", "search", "--rpm", "1", "--store", store)
        time.sleep(0.5)
        statuses = [send_chat(gate.url, chat_body(i), key=secret).status_code for i in range(2)]
        assert statuses == [200, 429]
        cli("teams", "set", "search", "--rpm", "none", "--store", store)
        cli("keys", "set", key_id, "--budget-usd", "0.000001", "--store", store)
        time.sleep(0.5)
        refused = send_chat(gate.url, chat_body(3), key=secret)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
