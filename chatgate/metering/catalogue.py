"""DeepSeek's price catalogue (catalogue.toml beside this file): dated per-token prices in USD and CNY, the
per-call prices and the peak calendar, read once (docs/metering.md#prices)."""

from __future__ import annotations

import datetime as dt
import functools
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from typing import Any

CURRENCIES = ("USD", "CNY")
SYMBOLS = {"USD": "$", "CNY": "¥"}


@dataclass(frozen=True, slots=True)
class Triple:
    """Per 1M tokens: cache hit, cache miss, output."""

    hit: Decimal
    miss: Decimal
    output: Decimal

    def __iter__(self) -> Any:
        return iter((self.hit, self.miss, self.output))

    def times(self, factor: Decimal) -> Triple:
        return Triple(self.hit * factor, self.miss * factor, self.output * factor)


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One currency's prices of a row: `peak` and `off_peak` (equal for a flat row)."""

    peak: Triple
    off_peak: Triple
    flat: bool


@dataclass(frozen=True, slots=True)
class Step:
    """A model's prices from `since` (unix seconds) until the next step."""

    since: float
    row: str  # the catalogue's row name ("flash"), or "config" for an override
    served_by: str
    source: str
    prices: dict[str, PriceRow]  # by currency; a currency not published is absent


@dataclass(frozen=True, slots=True)
class CallPrice:
    tool: str
    unit: str
    per: int
    prices: dict[str, Decimal]  # by currency, for `per` units
    since: float
    model_made_since: float | None
    source: str


@dataclass(frozen=True, slots=True)
class CalendarData:
    windows_utc: tuple[str, ...]
    peak_since: float
    weekdays_since: float
    holidays: tuple[dt.date, ...]
    make_up_workdays: tuple[dt.date, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Catalogue:
    models: dict[str, tuple[Step, ...]]  # each model's steps, oldest first
    calls: dict[str, CallPrice]
    calendar: CalendarData
    sources: dict[str, str]


def parse_time(text: str) -> float:
    """An ISO date or datetime (UTC unless it says otherwise) as unix seconds."""
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _triple(values: list[str]) -> Triple:
    hit, miss, output = (Decimal(v) for v in values)
    return Triple(hit, miss, output)


def _row(data: dict[str, Any]) -> dict[str, PriceRow]:
    out = {}
    for currency in CURRENCIES:
        table = data.get(currency.lower())
        if table is None:
            continue
        if "flat" in table:
            flat = _triple(table["flat"])
            out[currency] = PriceRow(flat, flat, True)
        else:
            out[currency] = PriceRow(_triple(table["peak"]), _triple(table["off_peak"]), False)
    return out


def parse(data: dict[str, Any]) -> Catalogue:
    rows = data["prices"]
    models = {}
    for name, model in data["models"].items():
        steps = []
        for since, row_name in model["history"]:
            row = rows[row_name]
            steps.append(Step(parse_time(since), row_name, row["served_by"], row["source"], _row(row)))
        models[name] = tuple(sorted(steps, key=lambda s: s.since))
    calls = {}
    for tool, call in data["calls"].items():
        prices = {c: Decimal(call[c.lower()]) for c in CURRENCIES if c.lower() in call}
        made = call.get("model_made_since")
        calls[tool] = CallPrice(tool, call["unit"], int(call["per"]), prices, parse_time(call["since"]),
                                parse_time(made) if made else None, call["source"])
    cal = data["calendar"]
    calendar = CalendarData(
        tuple(cal["windows_utc"]), parse_time(cal["peak_since"]), parse_time(cal["weekdays_since"]),
        tuple(dt.date.fromisoformat(d) for d in cal["holidays"]["dates"]),
        tuple(dt.date.fromisoformat(d) for d in cal["holidays"]["make_up_workdays"]),
        (*cal["sources"], cal["holidays"]["source"]))
    return Catalogue(models, calls, calendar, dict(data["sources"]))


@functools.cache
def catalogue() -> Catalogue:
    """The catalogue shipped in the package, read and parsed once per process."""
    text = resources.files("chatgate.metering").joinpath("catalogue.toml").read_text("utf-8")
    return parse(tomllib.loads(text))
