# ruff: noqa: RUF001  (the Chinese texts use Chinese punctuation)
"""The CLI's reports for people (issue 50): within 120 columns, no blank group label, one way to print rates
and money, in English or in Chinese (`--lang zh`, or LANG=zh_CN…)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatgate.metering import text
from chatgate.metering.reports import build_report, render_table
from chatgate.store.base import ReportQuery, UsageRecord
from chatgate.store.sqlite import SQLiteStore
from tests.metering.helpers import cli

BUSY = {"requests": 1_234_567, "rejected": 12_345, "limited": 123_456, "upstream_refused": 1_234,
        "upstream_failed": 123, "prompt_tokens": 987_654_321, "completion_tokens": 98_765_432,
        "cache_hit_rate": 0.512345, "cost_usd": 9_999.123456, "cache_saved_usd": 999.123456}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_busy_month_by_key_fits_120_columns(lang: str) -> None:
    rows = [{"key_id": "key_0123456789ab", "key_name": "nightly-eval-runner", "team": "platform-infra",
             **BUSY},
            {"key_id": "fp-0123456789abcdef", "key_name": None, "team": "default", **BUSY}]
    report = {"group_by": "key", "currency": "USD", "rows": rows, "totals": dict(BUSY)}
    lines = render_table(report, lang).splitlines()
    assert max(text.width(line) for line in lines) <= 120, "\n".join(lines)
    assert lines[2].startswith("nightly-eval-runner  ")
    assert lines[3].startswith("fp-0123456789abcdef")  # a passthrough caller: its fingerprint, never blank
    assert "$9,999.12" in lines[2] and "51.2%" in lines[2] and "$999.12" in lines[2]


def test_no_group_label_is_blank() -> None:
    rows = [{"rule_code": "", **BUSY}, {"rule_code": "empty_array", **BUSY}]
    report = {"group_by": "rule", "currency": "USD", "rows": rows, "totals": dict(BUSY)}
    en, zh = render_table(report, "en").splitlines(), render_table(report, "zh").splitlines()
    assert en[2].startswith("(not refused)") and en[3].startswith("empty_array")
    assert zh[2].startswith("（未被拒绝）")
    for lines in (en, zh):
        assert all(line.split() for line in lines)


def test_the_chinese_table_lines_up_by_terminal_columns() -> None:
    report = {"group_by": "team", "currency": "CNY", "rows": [{"team": "研发部", **BUSY, "cost_cny": 12.5,
                                                               "cache_saved_cny": 0.0001}],
              "totals": {**BUSY, "cost_cny": 12.5, "cache_saved_cny": 0.0001}}
    lines = render_table(report, "zh").splitlines()
    assert lines[0].split()[:6] == ["团队", "请求数", "规则拒绝", "限流", "DS拒绝", "DS失败"]
    assert lines[4].startswith("合计")
    assert "¥12.50" in lines[2] and "¥0.0001" in lines[2]  # a yuan amount with ¥, a small one not "0.00"
    widths = {text.width(line) for line in lines[:5]}
    assert len(widths) == 1, lines  # heads, rules, rows and total all end in the same column
    assert lines[5].startswith("DS拒绝：DeepSeek 的 4xx") and "CNY" in lines[5]


def test_rates_and_money_are_written_one_way() -> None:
    assert [text.rate(r) for r in (None, 0.0, 0.512345, 1.0)] == ["", "0.0%", "51.2%", "100.0%"]
    assert [text.money(v, "USD") for v in (0, 0.0001, 0.000421, 0.1234567, 12.345, 1234.5, 1e-9, -2.5)] == [
        "$0", "$0.0001", "$0.000421", "$0.123457", "$12.35", "$1,234.50", "<$0.000001", "-$2.50"]
    assert text.money(3.2, "CNY") == "¥3.20"


@pytest.mark.parametrize(("flag", "env", "expected"), [
    (None, {}, "en"), (None, {"LANG": "zh_CN.UTF-8"}, "zh"), (None, {"LANG": "en_US.UTF-8"}, "en"),
    (None, {"LC_ALL": "C", "LANG": "zh_CN.UTF-8"}, "en"), (None, {"LC_MESSAGES": "zh_TW"}, "zh"),
    ("en", {"LANG": "zh_CN.UTF-8"}, "en"), ("zh", {}, "zh")])
def test_the_language_comes_from_the_flag_then_the_locale(flag: str | None, env: dict[str, str],
                                                          expected: str) -> None:
    assert text.language(flag, env) == expected


def test_usage_and_cache_in_chinese_from_the_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    store = SQLiteStore(tmp_path / "usage.db")
    try:
        store.migrate()
        base = {"request_id": "r", "key_id": "key_aaaaaaaaaaaa", "key_name": "alpha", "team": "red",
                "model": "deepseek-flash", "route": "/v1/chat/completions", "stream": False, "outcome": "ok",
                "prompt_tokens": 640, "prompt_cache_hit_tokens": 512, "cost_picousd": 421_000_000}
        store.insert_usage([UsageRecord(record_id="a", ts=1_800_000_000.0, **base),
                            UsageRecord(record_id="b", ts=1_800_000_001.0, **{**base, "outcome": "rejected",
                                                                               "rule_code": "empty_array"})])
        report = build_report(store, ReportQuery("rule"))
    finally:
        store.close()
    assert {r["rule_code"] for r in report["rows"]} == {"", "empty_array"}
    env = {"LANG": "zh_CN.UTF-8", "LC_ALL": ""}
    by_rule = cli("usage", "--by", "rule", "--store", url, env=env).stdout.splitlines()
    assert by_rule[0].split()[:2] == ["规则或限额", "请求数"]
    assert any(line.startswith("（未被拒绝）") for line in by_rule)
    assert any(line.startswith("合计") and "$0.000842" in line and "80.0%" in line for line in by_rule)
    english = cli("usage", "--by", "rule", "--store", url, "--lang", "en", env=env).stdout
    assert english.startswith("rule_code") and "(not refused)" in english
    cache = cli("cache", "--by", "team", "--store", url, "--lang", "zh").stdout.splitlines()
    assert cache[0].split()[:3] == ["团队", "请求数", "输入"] and cache[-1].startswith("（~ 损失")


def test_prices_and_keys_fit_120_columns(tmp_path: Path) -> None:
    prices = cli("prices", "--currency", "both").stdout.splitlines()
    assert max(len(line) for line in prices) <= 120, "\n".join(prices)
    assert any(line.startswith("  [1] ") for line in prices)  # the sources, as notes under the table
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    cli("keys", "create", "--team", "platform-infra", "--name", "nightly-eval-runner", "--budget-usd", "50",
        "--rpm", "600", "--tpm", "100000", "--max-concurrent", "8", "--store", url)
    keys = cli("keys", "list", "--store", url).stdout.splitlines()
    assert max(len(line) for line in keys) <= 120, "\n".join(keys)
    assert keys[0].split()[-2:] == ["concurrent", "created"]


def test_keys_teams_and_prices_in_chinese_from_the_cli(tmp_path: Path) -> None:
    """Issue 50: `--lang zh` or LANG=zh_CN… prints the heads in Chinese (ids, names and models as they
    are), within 120 terminal columns; English stays the default."""
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    cli("keys", "create", "--team", "platform-infra", "--name", "nightly-eval-runner", "--budget-usd", "50",
        "--rpm", "600", "--max-concurrent", "8", "--store", url)
    zh_env = {"LANG": "zh_CN.UTF-8", "LC_ALL": "", "LC_MESSAGES": ""}
    en_env = {"LANG": "", "LC_ALL": "", "LC_MESSAGES": ""}
    cases = [(("keys", "list", "--store", url), ["密钥ID", "名称", "团队"], "budget_usd"),
             (("teams", "list", "--store", url), ["团队", "密钥数", "预算USD"], "remaining_"),
             (("prices", "--currency", "both", "--at", "2026-12-01T10:00:00Z"),  # a fixed time: equal outputs
              ["模型", "币种", "高峰价"], "off-peak")]
    for args, heads, english_word in cases:
        by_flag = cli(*args, "--lang", "zh", env=en_env).stdout
        by_locale = cli(*args, env=zh_env).stdout
        default = cli(*args, env=en_env).stdout
        assert by_flag == by_locale, args
        table = next(line for line in by_flag.splitlines() if line.startswith(heads[0]))
        assert table.split()[:3] == heads and english_word not in table, by_flag
        assert english_word in default and heads[1] not in default, default
        assert cli(*args, "--lang", "en", env=zh_env).stdout == default
        assert max(text.width(line) for line in by_flag.splitlines()) <= 120, by_flag
    assert "nightly-eval-runner" in cli("keys", "list", "--store", url, "--lang", "zh").stdout
