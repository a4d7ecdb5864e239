"""Prices by DeepSeek's calendar and in its yuan, end to end (issue 46 §3-§4, issue 48 finding 5): chatgate on
a loopback port in front of the fake DeepSeek, its clock set by the test (`create_app(clock=…)`: the time
requests are recorded, priced and limited at), the openai SDK as the client, the usage records and
`chatgate usage` read back."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fakes.server import RunningFake
from tests.harness import RunningChatgate
from tests.metering.helpers import cli
from tests.quotas.support import client, key_subject, set_limits, usd


class Clock:
    """The time chatgate sees, set by the test."""

    def __init__(self, when: str) -> None:
        self.now = 0.0
        self.set(when)

    def set(self, when: str) -> None:
        self.now = dt.datetime.fromisoformat(when).replace(tzinfo=dt.UTC).timestamp()

    def __call__(self) -> float:
        return self.now

# a model DeepSeek serves (since chatgate's rules were dated) that its catalogue has no price for
UNPRICED_SERVED = {"extra_models": ["deepseek-v9-secret"]}


def records(tmp_path: Path, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        conn = sqlite3.connect(tmp_path / "usage.db")
        conn.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in conn.execute("SELECT * FROM usage ORDER BY ts")]
        except sqlite3.OperationalError:
            rows = []
        finally:
            conn.close()
        if len(rows) >= count:
            return rows
        time.sleep(0.02)
    raise AssertionError(f"expected {count} usage records, found {len(rows)}")


def ask(gate: RunningChatgate, secret: str, model: str = "deepseek-flash", n: int = 0, **extra: Any) -> Any:
    return client(gate.url, secret).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": f"Question {n}: what is 2 + 2?"}], max_tokens=16,
        **extra)


def cost_at(row: dict[str, Any], hit: str, miss: str, output: str) -> int:
    """The row's tokens at these prices per 1M tokens, in pico-units (listed prices: whole pico-units)."""
    tokens = (row["prompt_cache_hit_tokens"], row["prompt_cache_miss_tokens"], row["completion_tokens"])
    return int(sum(n * Decimal(p) for n, p in zip(tokens, (hit, miss, output), strict=True)) * 10**6)


def usage_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = cli("usage", "--format", "json", "--store", f"sqlite:///{tmp_path}/usage.db", *args)
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def usage_table(tmp_path: Path, *args: str) -> str:
    return cli("usage", "--store", f"sqlite:///{tmp_path}/usage.db", *args).stdout


# --- the calendar, through a real server ------------------------------------------------------------------

FLASH_PEAK = ("0.006", "0.30", "1.20")
FLASH_OFF = ("0.003", "0.15", "0.60")


@pytest.mark.slow  # runs the CLI as a process
def test_prices_by_the_calendar_and_by_the_date(tmp_path: Path, start: Callable[..., RunningChatgate],
                                                fake: RunningFake) -> None:
    """A Saturday inside a weekday peak window is off-peak; a 2026 Chinese public holiday on a weekday
    (National Day, Thursday 2026-10-01) is off-peak; a weekday window is peak; a record before a price change
    is priced at the old price (deepseek-chat, DeepSeek-V3, 2025); a report across all of them sums each
    record at its own price."""
    clock = Clock("2026-11-28T02:00:00")  # Saturday, inside 01:00-04:00 UTC
    gate = start(clock)
    moments = [("2026-11-28T02:00:00", "deepseek-flash"), ("2026-10-01T07:00:00", "deepseek-flash"),
               ("2026-11-30T02:00:00", "deepseek-flash"), ("2025-06-02T02:00:00", "deepseek-chat"),
               ("2026-11-30T02:00:00", "deepseek-chat")]
    for i, (when, model) in enumerate(moments):
        clock.set(when)
        resp = ask(gate, "sk-calendar-0001", model, i)
        assert resp.status_code == 200
        assert "x-chatgate-warning" not in resp.headers
    rows = records(tmp_path, len(moments))
    found = {(Clock(when).now, model): None for when, model in moments}
    by_moment = {(r["ts"], r["model"]): r for r in rows}
    assert by_moment.keys() == found.keys()  # each record at the time the test's clock said
    saturday, holiday, weekday, old_chat, new_chat = (by_moment[Clock(w).now, m] for w, m in moments)
    assert saturday["cost_picousd"] == cost_at(saturday, *FLASH_OFF) > 0
    assert holiday["cost_picousd"] == cost_at(holiday, *FLASH_OFF)
    assert weekday["cost_picousd"] == cost_at(weekday, *FLASH_PEAK)
    assert old_chat["cost_picousd"] == cost_at(old_chat, "0.07", "0.27", "1.10")  # V3, one price all day
    assert new_chat["cost_picousd"] == cost_at(new_chat, *FLASH_PEAK)
    assert all(r["currency"] == "USD" and not r["unpriced"] for r in rows)

    report = usage_json(tmp_path, "--by", "day", "--since", "2025-01-01")
    assert report["currency"] == "USD"
    by_day = {r["day"]: r for r in report["rows"]}
    assert by_day["2025-06-02"]["cost_picousd"] == old_chat["cost_picousd"]
    assert by_day["2026-11-30"]["cost_picousd"] == weekday["cost_picousd"] + new_chat["cost_picousd"]
    assert report["totals"]["cost_picousd"] == sum(r["cost_picousd"] for r in rows)
    assert report["totals"]["cost"] == report["totals"]["cost_usd"] == pytest.approx(
        sum(r["cost_picousd"] for r in rows) / 1e12, abs=1e-9)
    assert all(r["currency"] == "USD" and r["cost"] == r["cost_usd"] for r in report["rows"])
    table = usage_table(tmp_path, "--by", "day")
    assert "cost_usd" in table.splitlines()[0] and "2025-06-02" in table


# --- yuan ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # runs the CLI as a process
def test_a_cny_deployment_prices_from_the_yuan_table_and_keeps_a_yuan_budget(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    """pricing.currency = CNY: each record is priced from the 元 table (0.02 / 1 / 4 元 off-peak), a budget
    set in yuan refuses once the next request could exceed it, and the reports say ¥ and cost_cny."""
    clock = Clock("2026-11-28T12:00:00")
    gate = start(clock, pricing={"currency": "CNY"})
    secret = "sk-yuan-caller-0001"
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(secret), budget_picousd=usd("0.004"),
               budget_period="day", budget_currency="CNY")
    ok = 0
    while ok < 100:
        try:
            ask(gate, secret, n=ok)
        except openai.RateLimitError as err:
            refused = err
            break
        ok += 1
    else:
        pytest.fail("the yuan budget never ran out")
    assert refused.code == "insufficient_quota" and "¥0.00" in refused.message
    rows = records(tmp_path, ok + 1)
    served = [r for r in rows if r["outcome"] == "ok"]
    assert len(served) == ok >= 2
    assert all(r["currency"] == "CNY" and r["cost_picousd"] == cost_at(r, "0.02", "1", "4") for r in served)
    spent = sum(r["cost_picousd"] for r in served)
    assert 0 < spent <= usd("0.004")
    # the next request's bound (its body's bytes at 1 元 + 16 output tokens at 4 元) did not fit
    assert spent + 16 * 4_000_000 > usd("0.004") - 2_000 * 1_000_000

    report = usage_json(tmp_path, "--by", "key", "--config", _config(tmp_path, "CNY"))
    assert report["currency"] == "CNY"
    (row,) = report["rows"]
    assert row["currency"] == "CNY" and row["cost_picocny"] == spent and row["cost_usd"] == 0
    assert row["cost"] == row["cost_cny"] == pytest.approx(spent / 1e12, abs=1e-9)
    table = usage_table(tmp_path, "--by", "key", "--config", _config(tmp_path, "CNY"))
    assert "cost_cny" in table.splitlines()[0]


def _config(tmp_path: Path, currency: str) -> str:
    path = tmp_path / f"chatgate-{currency}.toml"
    path.write_text(f'[pricing]\ncurrency = "{currency}"\n')
    return str(path)


def test_a_usd_budget_in_a_cny_deployment_is_refused_not_misread(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    """A budget set in USD (an existing store) when chatgate prices in CNY cannot be kept: refused, saying
    why, never read as yuan."""
    gate = start(Clock("2026-11-30T12:00:00"), pricing={"currency": "CNY"})
    secret = "sk-old-usd-budget-01"
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(secret), budget_picousd=usd("100"),
               budget_period="month")
    with pytest.raises(openai.RateLimitError) as err:
        ask(gate, secret)
    assert "set in USD" in err.value.message and "CNY" in err.value.message
    assert fake.state.requests == []


def test_auto_reads_the_accounts_currency_from_deepseek(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    """pricing.currency = auto in managed mode: /user/balance says CNY, so costs are in yuan."""
    fake.state.configure(balance_currency="CNY")
    gate = start(Clock("2026-11-30T02:00:00"), pricing={"currency": "auto"},
                 auth={"mode": "managed", "upstream_api_key": "sk-upstream-account-01",
                       "admin_key": "admin-key-for-the-price-tests-0001"})
    assert gate.state.pricing.currency == "CNY"
    assert any(r.path == "/user/balance" for r in fake.state.requests)


def test_auto_in_passthrough_mode_is_usd(tmp_path: Path, start: Callable[..., RunningChatgate],
                                         fake: RunningFake) -> None:
    fake.state.configure(balance_currency="CNY")
    gate = start(Clock("2026-11-30T02:00:00"), pricing={"currency": "auto"})
    assert gate.state.pricing.currency == "USD"
    assert fake.state.requests == []  # no caller's key is used to ask


# --- a model without a price (issue 48, finding 5) ------------------------------------------------------


def test_a_model_without_a_price_cannot_run_through_a_budget(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    """The attack: a $0.01 budget, requests to a model chatgate has no price for. Before: reserved and
    recorded at $0, all admitted, no warning. Now: reserved and recorded at the catalogue's highest price,
    with a warning, until the budget is spent."""
    gate = start(Clock("2026-11-30T02:00:00"), validation=UNPRICED_SERVED)
    secret = "sk-unpriced-attack-01"
    budget = usd("0.01")
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(secret), budget_picousd=budget,
               budget_period="day")
    padding = "x" * 4000
    admitted, refused = 0, 0
    for n in range(10):
        try:
            resp = client(gate.url, secret).chat.completions.with_raw_response.create(
                model="deepseek-v9-secret", messages=[{"role": "user", "content": f"{n} {padding}"}],
                max_tokens=8)
        except openai.RateLimitError as err:
            assert err.code == "insufficient_quota"
            refused += 1
            continue
        assert "no USD price for the model 'deepseek-v9-secret'" in resp.headers["x-chatgate-warning"]
        admitted += 1
    assert refused > 0 and admitted > 0
    rows = records(tmp_path, 10)
    served = [r for r in rows if r["outcome"] == "ok"]
    assert all(r["unpriced"] and r["cost_picousd"] == cost_at(r, "0.044", "1.32", "3.96") > 0 for r in served)
    assert sum(r["cost_picousd"] for r in served) <= budget


def test_limits_unpriced_refuse(tmp_path: Path, start: Callable[..., RunningChatgate],
                                fake: RunningFake) -> None:
    """limits.unpriced = refuse: a caller with a budget gets a 400 for an unpriced model; one without a
    budget is served, with the warning, and recorded at the highest price."""
    gate = start(Clock("2026-11-30T12:00:00"), limits={"unpriced": "refuse"}, validation=UNPRICED_SERVED)
    budgeted = "sk-unpriced-budget-01"
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(budgeted), budget_picousd=usd("100"),
               budget_period="month")
    with pytest.raises(openai.BadRequestError) as err:
        ask(gate, budgeted, "deepseek-v9-secret")
    assert err.value.code == "unpriced_model" and "cannot be kept" in err.value.message
    assert ask(gate, budgeted, "deepseek-flash").status_code == 200
    free = ask(gate, "sk-unpriced-free-0001", "deepseek-v9-secret")
    assert "refused where a budget applies" in free.headers["x-chatgate-warning"]
    rows = records(tmp_path, 3)
    assert [r["outcome"] for r in rows] == ["limited", "ok", "ok"]
    assert rows[0]["rule_code"] == "unpriced:key"
    assert rows[2]["unpriced"] and rows[2]["cost_picousd"] == cost_at(rows[2], "0.022", "0.66", "1.98")
