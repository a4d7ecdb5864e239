"""`chatgate prices`: the prices in force at a time, per model and currency, with their sources and dates;
the peak calendar, the holidays and the next peak window (docs/metering.md#prices)."""

from __future__ import annotations

import datetime as dt
import textwrap
from typing import Any

from chatgate.metering import text
from chatgate.metering.catalogue import SYMBOLS, Triple, catalogue
from chatgate.metering.pricing import Pricing

WIDTH = 120  # a terminal's columns the printed prices keep to


def _iso(ts: float) -> str | None:
    if ts == float("-inf"):
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _prices(t: Triple) -> dict[str, str]:
    return {"cache_hit": str(t.hit), "cache_miss": str(t.miss), "output": str(t.output)}


def price_table(books: list[Pricing], at: float) -> dict[str, Any]:
    """The table as JSON: `models` (one entry per model and currency with a price at `at`, and `unpriced`
    for those without), `calls`, `calendar` (the rule, holidays, make-up days, `peak_now`, `next_peak`)."""
    models = []
    unpriced: dict[str, list[str]] = {}
    for book in books:
        for name in sorted(book.tariffs):
            period = book.tariffs[name].period(at)
            if period is None:
                unpriced.setdefault(book.currency, []).append(name)
                continue
            step, row = period.step, period.row
            models.append({"model": name, "currency": book.currency, "since": _iso(step.since),
                           "row": step.row, "served_by": step.served_by, "source": step.source,
                           "flat": row.flat, "peak": _prices(row.peak), "off_peak": _prices(row.off_peak)})
    calendar = books[0].calendar
    source = catalogue()
    nxt = calendar.next_peak(at)
    calls = [{"tool": c.tool, "unit": c.unit, "per": c.per, "since": _iso(c.since),
              "model_made_since": _iso(c.model_made_since) if c.model_made_since is not None else None,
              "prices": {cur: str(v) for cur, v in c.prices.items()}, "source": c.source}
             for c in source.calls.values()]
    return {
        "at": _iso(at), "currencies": [b.currency for b in books], "unit": "per 1M tokens", "models": models,
        "unpriced": unpriced, "calls": calls,
        "calendar": {
            "windows_utc": list(calendar.windows),
            "peak_since": _iso(calendar.peak_since), "weekdays_since": _iso(calendar.weekdays_since),
            "rule": "peak inside the windows (UTC) Monday to Friday, judged on the Beijing date; weekends "
                    "and Chinese public holidays off-peak all day; before peak_since one price all day",
            "holidays": sorted(_day(d) for d in calendar.holidays),
            "make_up_workdays": [d.isoformat() for d in source.calendar.make_up_workdays],
            "peak_days": sorted(_day(d) for d in calendar.peak_days),
            "peak_now": calendar.is_peak(at) and at >= calendar.peak_since,
            "next_peak": None if nxt is None else {"start": _iso(nxt[0]), "end": _iso(nxt[1])},
        },
        "sources": source.sources,
    }


def _day(number: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=number)).isoformat()


def render_price_table(table: dict[str, Any], lang: str = "en") -> str:
    """The prices for people, within 120 columns: each row's sources as a note number, listed below."""
    lines = [f"Prices in force at {table['at']} ({table['unit']}: cache hit / cache miss / output)", ""]
    heads = ("model", "currency", "peak", "off-peak", "since (UTC)", "row", "source")
    rows = []
    sources: list[str] = []
    for m in table["models"]:
        symbol = SYMBOLS[m["currency"]]
        cells = [" / ".join(f"{symbol}{v}" for v in m[k].values()) for k in ("peak", "off_peak")]
        if m["source"] not in sources:
            sources.append(m["source"])
        since = m["since"].replace("T", " ")[:16] if m["since"] else "-"
        note = f"[{sources.index(m['source']) + 1}]"
        off_peak = "(flat)" if m["flat"] else cells[1]
        rows.append((m["model"], m["currency"], cells[0], off_peak, since, m["row"], note))
    lines += text.table([text.word(h, lang) for h in heads], rows, None, len(heads))
    lines += [f"  [{i}] {source}" for i, source in enumerate(sources, 1)]
    for currency, names in table["unpriced"].items():
        lines.append(f"No {currency} price then: {', '.join(names)} (billed at the catalogue's highest "
                     "price)")
    lines += ["", "Per call:"]
    for c in table["calls"]:
        prices = ", ".join(f"{SYMBOLS[cur]}{v}" for cur, v in c["prices"].items())
        made = f"; made by the model: billed from {c['model_made_since']}" if c["model_made_since"] else ""
        lines.append(f"  {c['tool']}: {prices} per {c['per']:,} {c['unit']}s (since {c['since']}{made})")
    cal = table["calendar"]
    lines += ["", f"Peak calendar: {cal['rule']}.", f"  windows (UTC): {', '.join(cal['windows_utc'])}; "
              f"peak from {cal['peak_since']}, weekdays only from {cal['weekdays_since']}",
              f"  holidays (off-peak): {', '.join(cal['holidays']) or 'none'}",
              "  make-up working days (off-peak unless in pricing.peak_days): "
              + ", ".join(cal["make_up_workdays"])]
    if cal["peak_days"]:
        lines.append(f"  priced as weekdays (pricing.peak_days): {', '.join(cal['peak_days'])}")
    nxt = cal["next_peak"]
    now = "peak" if cal["peak_now"] else "off-peak"
    lines.append(f"  at {table['at']}: {now}; " + ("no peak window ahead" if nxt is None else
                 f"{'this' if cal['peak_now'] else 'next'} peak window {nxt['start']} to {nxt['end']}"))
    return "\n".join(wrapped for line in lines for wrapped in _wrap(line)) + "\n"


def _wrap(line: str) -> list[str]:
    """A line longer than 120 columns, wrapped under its own indent (and four more)."""
    if len(line) <= WIDTH:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()))
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent + "    ", break_on_hyphens=False)
