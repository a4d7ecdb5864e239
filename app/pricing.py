"""Cost of a request from the price table, DeepSeek's peak / off-peak windows applied by time (§8)."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from app.profiles import Prices
from app.usage import TokenCounts

PICO_PER_USD_PER_MTOK = Decimal(1_000_000)  # USD per 1M tokens -> picoUSD per token


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def is_peak(ts: float, windows: list[str]) -> bool:
    t = dt.datetime.fromtimestamp(ts, dt.UTC)
    now = t.hour * 60 + t.minute
    for window in windows:
        start, end = (_minutes(x) for x in window.split("-"))
        if start <= now < end:
            return True
    return False


def cost_picousd(tokens: TokenCounts, prices: Prices | None, ts: float, windows: list[str],
                 off_peak_multiplier: Decimal) -> int:
    """Integer picoUSD (1e-12 USD) so that sums over millions of records stay exact."""
    if prices is None:
        return 0
    usd_per_mtok = (tokens.prompt_cache_hit_tokens * prices.input_cache_hit
                    + tokens.prompt_cache_miss_tokens * prices.input_cache_miss
                    + tokens.completion_tokens * prices.output)
    if not is_peak(ts, windows):
        usd_per_mtok *= off_peak_multiplier
    return int((usd_per_mtok * PICO_PER_USD_PER_MTOK).to_integral_value(ROUND_HALF_UP))


def picousd_to_usd(pico: int) -> Decimal:
    return Decimal(pico) / Decimal(10**12)
