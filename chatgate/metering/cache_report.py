"""The cache report: per caller (key, team or model), its context-cache hit rate, what the hits saved, and
the prefix breaks that cost it, by where they happen (`chatgate cache`, `GET /admin/cache`).

Counts and money come from the usage records (every replica's); a break's loss is an estimate
(docs/cache.md). No prompt text is stored, so none can be shown.
"""

from __future__ import annotations

from typing import Any

from chatgate.metering import text
from chatgate.metering.cache import hint
from chatgate.metering.reports import ReportError, _units, hit_rate, parse_time
from chatgate.store.base import GroupBy, ReportQuery, UsageStore

CACHE_BYS: tuple[str, ...] = ("key", "team", "model")
_CALLER_FIELDS = {"key": ("key_id", "key_name", "team"), "team": ("team",), "model": ("model",)}


def cache_query(by: str, since: str | None, until: str | None) -> tuple[GroupBy, float | None, float | None]:
    if by not in CACHE_BYS:
        raise ReportError(f"--by must be one of {', '.join(CACHE_BYS)}, got {by!r}")
    group: GroupBy = "key" if by == "key" else "team" if by == "team" else "model"
    return group, parse_time(since, "since"), parse_time(until, "until")


def build_cache_report(store: UsageStore, by: GroupBy, since: float | None, until: float | None,
                       currency: str = "USD") -> dict[str, Any]:
    """Money in `currency` (USD or CNY: the records priced in it): `saved_usd`, `lost_picousd`, … or
    `saved_cny`, `lost_picocny`, …"""
    fields = _CALLER_FIELDS[by]
    cur = "cny" if currency == "CNY" else "usd"
    saved, lost = f"cache_saved_pico{cur}", f"cache_lost_pico{cur}"
    totals_of = (("requests", "requests"), ("prompt_tokens", "prompt_tokens"),
                 ("cache_hit_tokens", "prompt_cache_hit_tokens"), (f"saved_pico{cur}", saved),
                 (f"lost_pico{cur}", lost), ("breaks", "cache_breaks"))
    breaks: dict[str, list[dict[str, Any]]] = {}
    kind: GroupBy = "break_key" if by == "key" else "break_team" if by == "team" else "break_model"
    for row in store.usage_report(ReportQuery(kind, since, until)):
        c, param = row.counters, row.group["cache_break"]
        breaks.setdefault(row.group[fields[0]], []).append({
            "param": param, "count": c["requests"], "lost_tokens": c["cache_lost_tokens"],
            f"lost_{cur}": _units(c[lost]), f"lost_pico{cur}": c[lost],
            "example_request_id": row.group["example_request_id"], "hint": hint(param),
        })
    rows = []
    totals = dict.fromkeys((name for name, _ in totals_of), 0)
    for row in store.usage_report(ReportQuery(by, since, until)):
        c = row.counters
        found = sorted(breaks.get(row.group[fields[0]], []),
                       key=lambda b: (-b[f"lost_pico{cur}"], -b["count"], b["param"]))
        entry: dict[str, Any] = {
            **{f: row.group.get(f) for f in fields},
            "requests": c["requests"], "prompt_tokens": c["prompt_tokens"],
            "cache_hit_tokens": c["prompt_cache_hit_tokens"],
            "hit_rate": hit_rate(c["prompt_cache_hit_tokens"], c["prompt_tokens"]),
            f"saved_{cur}": _units(c[saved]), f"lost_{cur}": _units(c[lost]),
            f"saved_pico{cur}": c[saved], f"lost_pico{cur}": c[lost],
            "lost_estimated": True, "break_count": c["cache_breaks"], "breaks": found,
        }
        rows.append(entry)
        for name, counter in totals_of:
            totals[name] += c[counter]
    rows.sort(key=lambda r: (-r[f"lost_pico{cur}"], -r["prompt_tokens"], str(r[fields[0]])))
    return {
        "by": by, "since": since, "until": until, "currency": cur.upper(), "rows": rows,
        "totals": {**totals, "hit_rate": hit_rate(totals["cache_hit_tokens"], totals["prompt_tokens"]),
                   f"saved_{cur}": _units(totals[f"saved_pico{cur}"]),
                   f"lost_{cur}": _units(totals[f"lost_pico{cur}"])},
    }


def render_cache_table(report: dict[str, Any], lang: str = "en") -> str:
    """The cache report for people (rates and money as text.py prints them); `lang` "zh": in Chinese."""
    fields = _CALLER_FIELDS[report["by"]]
    currency = report.get("currency", "USD")
    cur = currency.lower()
    heads = [*fields, "requests", "prompt", "cache_hit", "hit_rate", f"saved_{cur}", f"lost_{cur}~", "breaks"]
    if lang == "zh":
        heads = [text.word({f"saved_{cur}": "saved", f"lost_{cur}~": "lost~", "key_id": "key",
                            "key_name": "key"}.get(h, h), lang) for h in heads]
    lines = [[*(str(row.get(f) or text.word("(none)", lang)) for f in fields),
              *_numbers(row, row["break_count"], currency)] for row in report["rows"]]
    t = report["totals"]
    total = [text.word("TOTAL", lang), *[""] * (len(fields) - 1), *_numbers(t, t["breaks"], currency)]
    table = text.table(heads, lines, total, len(fields))
    out = table[:2]
    for row, line in zip(report["rows"], table[2:2 + len(lines)], strict=True):
        out.append(line)
        for b in row["breaks"]:
            lost = text.money(b[f"lost_{cur}"], currency)
            out.append(f"    break at {b['param']}: {b['count']} request(s), ~{b['lost_tokens']} tokens, "
                       f"~{lost} lost (e.g. request {b['example_request_id']})")
            out.append(f"      hint: {b['hint']}")
    out += [*table[2 + len(lines):], text.note("cache_lost", lang)]
    return "\n".join(out) + "\n"


def _numbers(row: dict[str, Any], breaks: int, currency: str) -> list[str]:
    cur = currency.lower()
    return [str(row["requests"]), str(row["prompt_tokens"]), str(row["cache_hit_tokens"]),
            text.rate(row["hit_rate"]), text.money(row[f"saved_{cur}"], currency),
            text.money(row[f"lost_{cur}"], currency), str(breaks)]
