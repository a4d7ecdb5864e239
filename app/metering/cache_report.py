"""The cache report: per caller (key, team or model), its context-cache hit rate, what the hits saved, and
the prefix breaks that cost it, by where they happen (`chatgate cache`, `GET /admin/cache`).

Counts and money come from the usage records (every replica's); a break's loss is an estimate
(docs/cache.md). No prompt text is stored, so none can be shown.
"""

from __future__ import annotations

from typing import Any

from app.metering.cache import hint
from app.metering.reports import ReportError, _units, hit_rate, parse_time
from app.store.base import GroupBy, ReportQuery, UsageStore

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


def render_cache_table(report: dict[str, Any]) -> str:
    fields = _CALLER_FIELDS[report["by"]]
    cur = report.get("currency", "USD").lower()
    heads = [*fields, "requests", "prompt", "cache_hit", "hit_rate", f"saved_{cur}", f"lost_{cur}~", "breaks"]
    lines = [[*(str(row.get(f) or "") for f in fields), *_numbers(row, row["break_count"], cur)]
             for row in report["rows"]]
    t = report["totals"]
    total = ["TOTAL", *[""] * (len(fields) - 1), *_numbers(t, t["breaks"], cur)]
    widths = [max(len(h), *(len(line[i]) for line in [*lines, total])) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" if i < len(fields) else f"{{:>{w}}}" for i, w in enumerate(widths))
    rule = "  ".join("-" * w for w in widths)
    out = [fmt.format(*heads), rule]
    for row, line in zip(report["rows"], lines, strict=True):
        out.append(fmt.format(*line))
        for b in row["breaks"]:
            out.append(f"    break at {b['param']}: {b['count']} request(s), ~{b['lost_tokens']} tokens, "
                       f"~{b[f'lost_{cur}']:.6f} {cur.upper()} lost (e.g. request {b['example_request_id']})")
            out.append(f"      hint: {b['hint']}")
    out += [rule, fmt.format(*total),
            "(~ lost: estimated from the earlier request's measured prompt tokens; see docs/cache.md)"]
    return "\n".join(out) + "\n"


def _numbers(row: dict[str, Any], breaks: int, cur: str) -> list[str]:
    hits = row["cache_hit_tokens"]
    return [str(row["requests"]), str(row["prompt_tokens"]), str(hits), _rate(row["hit_rate"]),
            f"{row[f'saved_{cur}']:.6f}", f"{row[f'lost_{cur}']:.6f}", str(breaks)]


def _rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.1%}"
