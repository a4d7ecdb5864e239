"""Usage reports: the same numbers for `chatgate usage` and `GET /admin/usage`."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import math
import re
import time
from decimal import Decimal
from typing import Any

from chatgate.metering import text
from chatgate.metering.calls import TOOLS
from chatgate.metering.catalogue import SYMBOLS
from chatgate.metering.pricing import to_units
from chatgate.store.base import COUNTERS, GROUP_BYS, GroupBy, ReportQuery, ReportRow, UsageStore

GROUP_FIELDS: dict[str, tuple[str, ...]] = {
    "key": ("key_id", "key_name", "team"), "team": ("team",), "model": ("model",), "day": ("day",),
    "rule": ("rule_code",), "repair": ("repair",), "account": ("account",),
}
PICO_COUNTERS = ("cost_picousd", "cache_saved_picousd", "cache_lost_picousd", "billed_picousd",
                 "cost_picocny", "cache_saved_picocny", "cache_lost_picocny", "billed_picocny")
OUTPUT_COUNTERS = tuple(c for c in COUNTERS if c not in PICO_COUNTERS)
# computed from the counters: `cost` and `currency` are the report's currency's; billed_*: the part of the
# cost that tool calls and a model's web searches and fetches make
DERIVED = ("cache_hit_rate", "currency", "cost", "cost_usd", "cost_cny", "cache_saved_usd", "cache_lost_usd",
           "cache_saved_cny", "cache_lost_cny", "billed_usd", "billed_cny")


class ReportError(ValueError):
    """A bad filter; the message names it."""


MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z


RELATIVE = re.compile(r"^(\d{1,6})([hdw])$")
UNIT_SECONDS = {"h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_time(value: str | None, name: str, now: float | None = None) -> float | None:
    """ISO date or datetime (UTC unless it says otherwise), unix seconds, a span back from now (`24h`, `7d`,
    `2w`), or `today` / `yesterday` (from 00:00 UTC)."""
    if value is None or value == "":
        return None
    now = time.time() if now is None else now
    word = value.strip().lower()
    if word in ("today", "yesterday"):
        midnight = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - dt.timedelta(days=1 if word == "yesterday" else 0)).timestamp()
    relative = RELATIVE.match(word)
    if relative:
        return now - int(relative.group(1)) * UNIT_SECONDS[relative.group(2)]
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or abs(seconds) > MAX_SECONDS:
            raise ReportError(f"--{name}: {value!r} is not a time (unix seconds within years 1-9999)")
        return seconds
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ReportError(
            f"--{name}: expected a date (2026-11-30), a datetime (2026-11-30T08:00), unix seconds, a span "
            f"back from now (24h, 7d, 2w) or today / yesterday (UTC), got {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def make_query(group_by: str, since: str | None, until: str | None, team: str | None = None,
               key_id: str | None = None) -> ReportQuery:
    if group_by not in GROUP_BYS:
        raise ReportError(f"group by must be one of {', '.join(GROUP_BYS)}, got {group_by!r}")
    gb: GroupBy = group_by
    return ReportQuery(gb, parse_time(since, "since"), parse_time(until, "until"), team or None,
                       key_id or None)


def _units(pico: int) -> float:
    return float(to_units(pico).quantize(Decimal("0.000000001")))


def hit_rate(hit_tokens: int, prompt_tokens: int) -> float | None:
    """The share of prompt tokens DeepSeek served from its context cache (None with no prompt tokens)."""
    return round(hit_tokens / prompt_tokens, 6) if prompt_tokens > 0 else None


def _counters(counters: dict[str, int], currency: str) -> dict[str, Any]:
    out: dict[str, Any] = {name: int(counters.get(name, 0)) for name in OUTPUT_COUNTERS}
    out["cache_hit_rate"] = hit_rate(out["prompt_cache_hit_tokens"], out["prompt_tokens"])
    for suffix in ("usd", "cny"):
        out[f"cost_{suffix}"] = _units(int(counters.get(f"cost_pico{suffix}", 0)))
        out[f"cache_saved_{suffix}"] = _units(int(counters.get(f"cache_saved_pico{suffix}", 0)))
        out[f"cache_lost_{suffix}"] = _units(int(counters.get(f"cache_lost_pico{suffix}", 0)))
        out[f"billed_{suffix}"] = _units(int(counters.get(f"billed_pico{suffix}", 0)))  # part of cost_*
    out["currency"] = currency
    out["cost"] = out[f"cost_{currency.lower()}"]
    for name in PICO_COUNTERS:
        out[name] = int(counters.get(name, 0))
    return out


def report_currency(configured: str, totals: dict[str, int]) -> str:
    """The currency a report is in: the configured one; for "auto", the one the records were priced in
    (CNY when any was)."""
    if configured != "auto":
        return configured
    return "CNY" if int(totals.get("cost_picocny", 0)) or int(totals.get("cache_saved_picocny", 0)) else "USD"


def build_report(store: UsageStore, query: ReportQuery, currency: str = "USD") -> dict[str, Any]:
    """The report in `currency` (pricing.currency: USD, CNY or auto): each row's `cost`, with `cost_usd` and
    `cost_cny` apart (a record's cost is in the currency it was priced in; never converted)."""
    rows: list[ReportRow] = store.usage_report(query)
    totals = dict.fromkeys(COUNTERS, 0)
    out_rows: list[tuple[dict[str, str | None], dict[str, int]]] = []
    for row in rows:
        for name in COUNTERS:
            totals[name] += int(row.counters.get(name, 0))
        fields = {f: row.group.get(f) for f in GROUP_FIELDS[query.group_by]}
        out_rows.append((fields, row.counters))
    if query.group_by == "repair":  # a request with two repairs is in two rows: total each request once
        totals = dict.fromkeys(COUNTERS, 0)
        for row in store.usage_report(dataclasses.replace(query, group_by="rule")):
            for name in COUNTERS:
                totals[name] += int(row.counters.get(name, 0))
    money = report_currency(currency, totals)
    report: dict[str, Any] = {"group_by": query.group_by, "since": query.since, "until": query.until,
                              "currency": money,
                              "rows": [{**fields, **_counters(counters, money)}
                                       for fields, counters in out_rows],
                              "totals": _counters(totals, money)}
    if totals["unpriced_requests"]:  # never a silent $0: which models had no price
        by_model = store.usage_report(dataclasses.replace(query, group_by="model"))
        report["unpriced_models"] = sorted(row.group["model"] for row in by_model
                                           if int(row.counters.get("unpriced_requests", 0)))
    return report


def render_csv(report: dict[str, Any]) -> str:
    fields = [*GROUP_FIELDS[report["group_by"]], *OUTPUT_COUNTERS, *DERIVED]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(report["rows"])
    writer.writerow({fields[0]: "TOTAL", **report["totals"]})
    return buf.getvalue()


# the table's outcome columns: chatgate's refusals by a rule (rejected) and by a limit (limited), DeepSeek's
# 4xx (ds_refused) and its 5xx or no answer (ds_failed)
OUTCOME_COLUMNS = (("rejected", "rejected"), ("limited", "limited"), ("ds_refused", "upstream_refused"),
                   ("ds_failed", "upstream_failed"))


# What a group's label says when its field is empty: no rule or limit refused the request, it had no repair,
# it reached no account of the pool; a passthrough caller has no key name
BLANK = {"rule_code": "(not refused)", "repair": "(no repair)", "account": "(no account)"}
KEY_LABEL = 24  # columns for a key's name in the table by key (a passthrough fingerprint takes 19)


def render_table(report: dict[str, Any], lang: str = "en") -> str:
    """The report for people, within 120 columns: a key is shown by its name (its fingerprint when it has
    none; ids and teams are in the JSON and CSV reports), tokens and money as people read them (text.py:
    987.7M, $0.000421, 51.2%; exact in the JSON and CSV reports); the cache's hit and
    miss tokens, the reasoning tokens and the estimated and unpriced counts are in the JSON and CSV reports
    (a note below the table says when any request was estimated); the billed tool calls get their columns
    only when there were some. `lang` "zh": the heads and notes in Chinese."""
    group = ["key"] if report["group_by"] == "key" else list(GROUP_FIELDS[report["group_by"]])
    currency = report.get("currency", "USD")
    money = currency.lower()
    symbol = SYMBOLS[currency]
    totals = report["totals"]
    calls = bool(totals.get("billed_calls"))
    heads = [*group, "requests", *(h for h, _ in OUTCOME_COLUMNS), "input", "output", "hit%",
             *(("calls", "calls_cost") if calls else ()), "cost", "saved"]
    if lang == "en":
        heads = [f"{h}_{money}" if h in ("cost", "saved") else f"calls_{money}" if h == "calls_cost" else h
                 for h in heads]
    else:
        heads = [text.word(h, lang) for h in heads]

    def numbers(row: dict[str, Any]) -> list[str]:
        return [text.count(row.get("requests")), *(text.count(row.get(k)) for _, k in OUTCOME_COLUMNS),
                text.tokens(row.get("prompt_tokens")), text.tokens(row.get("completion_tokens")),
                text.rate(row.get("cache_hit_rate")),
                *((text.count(row.get("billed_calls")), text.money(row.get(f"billed_{money}"), currency))
                  if calls else ()),
                text.money(row.get(f"cost_{money}"), currency),
                text.money(row.get(f"cache_saved_{money}"), currency)]

    def labels(row: dict[str, Any]) -> list[str]:
        if report["group_by"] == "key":
            return [text.clip(str(row.get("key_name") or row.get("key_id") or text.word("(none)", lang)),
                              KEY_LABEL)]
        value = row.get(group[0])
        return [str(value) if value else text.word(BLANK.get(group[0], "(none)"), lang)]

    rows = [[*labels(row), *numbers(row)] for row in report["rows"]]
    total = [text.word("TOTAL", lang), *[""] * (len(group) - 1), *numbers(totals)]
    lines = text.table(heads, rows, total, len(group))
    notes = [text.note("legend", lang, currency)]
    if report["group_by"] == "key":
        notes.append(text.note("key_ids", lang))
    if totals.get("estimated_requests"):
        notes.append(text.note("estimated", lang, totals["estimated_requests"]))
    if totals.get("billed_pages") or totals.get("billed_characters"):
        notes.append(f"billed units besides calls: {totals.get('billed_pages', 0)} OCR page(s), "
                     f"{totals.get('billed_characters', 0)} TTS character(s) (priced in yuan only: see "
                     "docs/metering.md#tool-calls)")
    if report.get("unpriced_models"):
        unpriced = report["unpriced_models"]
        models = [m for m in unpriced if m not in TOOLS]
        tools = [m for m in unpriced if m in TOOLS]
        if models:
            counted = f"{totals['unpriced_requests']} " if not tools else ""
            notes.append(f"{counted}request(s) of models without a price, counted at the catalogue's highest "
                         f"price: {', '.join(models)} "
                         "(set their prices: docs/metering.md#models-without-a-price)")
        if tools:
            notes.append(f"tool calls without a published {currency} price, counted at 0: "
                         f"{', '.join(tools)} (docs/metering.md#tool-calls)")
    other = "CNY" if currency == "USD" else "USD"
    if totals.get(f"cost_pico{other.lower()}"):  # records priced in the other currency: never added up
        extra = text.money(totals[f"cost_{other.lower()}"], other)
        notes.append(text.note("other_currency", lang, symbol, extra, other, other.lower()))
    return "\n".join([*lines, *notes]) + "\n"


