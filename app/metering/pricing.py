"""Cost of a request from the price table, DeepSeek's peak / off-peak windows applied by time
(docs/metering.md#prices)."""

from __future__ import annotations

import functools
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from app.metering.usage import TokenCounts
from app.profiles import Prices

PICO_PER_USD_PER_MTOK = Decimal(1_000_000)  # USD per 1M tokens -> picoUSD per token


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


@functools.lru_cache(maxsize=16)
def _spans(windows: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    pairs = (window.split("-") for window in windows)
    return tuple((_minutes(start), _minutes(end)) for start, end in pairs)


def is_peak(ts: float, windows: list[str]) -> bool:
    return _peak_minute(int(ts // 60) % (24 * 60), tuple(windows))  # POSIX time has no leap seconds


@functools.lru_cache(maxsize=4096)
def _peak_minute(minute_of_day: int, windows: tuple[str, ...]) -> bool:
    """A window whose end is before its start crosses midnight: [start, 24:00) and [00:00, end)."""
    return any(start <= minute_of_day < end if start < end else not end <= minute_of_day < start
               for start, end in _spans(windows))


# (minute, prices, windows) -> whole_rates' answer, with the objects it was worked out for: their ids are
# not reused while they are held here
_WHOLE: dict[tuple[int, int, int], tuple[Prices, list[str], Decimal, tuple[int, int, int] | None]] = {}
_LAST: list[tuple[int, Prices | None, list[str] | None, Decimal | None, tuple[int, int, int] | None]] = [
    (-1, None, None, None, None)]


def whole_rates(prices: Prices, ts: float, windows: list[str], off_peak_multiplier: Decimal
                ) -> tuple[int, int, int] | None:
    """picoUSD per cache-hit, cache-miss and output token at `ts`, when all three are whole numbers (prices
    of at most six decimals, halved off-peak: every price DeepSeek lists), else None. Integer arithmetic on
    them gives the exact Decimal result, without its ~2 µs per cost; remembered per minute (the peak windows
    are whole minutes)."""
    minute = int(ts // 60)
    last = _LAST[0]  # (nearly) every request of a minute asks the same
    if last[0] == minute and last[1] is prices and last[2] is windows and last[3] is off_peak_multiplier:
        return last[4]
    key = (minute, id(prices), id(windows))
    known = _WHOLE.get(key)
    if known is not None and known[0] is prices and known[1] is windows and known[2] is off_peak_multiplier:
        _LAST[0] = (minute, prices, windows, off_peak_multiplier, known[3])
        return known[3]
    scale = PICO_PER_USD_PER_MTOK * (1 if is_peak(ts, windows) else off_peak_multiplier)
    rates = [price * scale for price in (prices.input_cache_hit, prices.input_cache_miss, prices.output)]
    whole = (int(rates[0]), int(rates[1]), int(rates[2])) if all(r == r.to_integral_value() for r in rates) \
        else None
    if len(_WHOLE) >= 1024:
        _WHOLE.clear()
    _WHOLE[key] = (prices, windows, off_peak_multiplier, whole)
    _LAST[0] = (minute, prices, windows, off_peak_multiplier, whole)
    return whole


def cost_picousd(tokens: TokenCounts, prices: Prices | None, ts: float, windows: list[str],
                 off_peak_multiplier: Decimal) -> int:
    """Integer picoUSD (1e-12 USD) so that sums over millions of records stay exact."""
    if prices is None:
        return 0
    whole = whole_rates(prices, ts, windows, off_peak_multiplier)
    if whole is not None:
        return (tokens.prompt_cache_hit_tokens * whole[0] + tokens.prompt_cache_miss_tokens * whole[1]
                + tokens.completion_tokens * whole[2])
    usd_per_mtok = (tokens.prompt_cache_hit_tokens * prices.input_cache_hit
                    + tokens.prompt_cache_miss_tokens * prices.input_cache_miss
                    + tokens.completion_tokens * prices.output)
    if not is_peak(ts, windows):
        usd_per_mtok *= off_peak_multiplier
    return int((usd_per_mtok * PICO_PER_USD_PER_MTOK).to_integral_value(ROUND_HALF_UP))


@functools.lru_cache(maxsize=64)
def _rates(prices: Prices, peak: bool, off_peak_multiplier: Decimal) -> tuple[int, int]:
    """picoUSD per cache-miss input token and per output token, rounded up."""
    scale = PICO_PER_USD_PER_MTOK * (1 if peak else off_peak_multiplier)
    return (int((prices.input_cache_miss * scale).to_integral_value(ROUND_CEILING)),
            int((prices.output * scale).to_integral_value(ROUND_CEILING)))


def cost_bound_picousd(prompt_tokens: int, completion_tokens: int, prices: Prices | None, ts: float,
                       windows: list[str], off_peak_multiplier: Decimal) -> int:
    """An upper bound of `cost_picousd` for this many tokens, all of the prompt a cache miss (what a limit
    reserves before the request goes out): integer arithmetic, per-token prices rounded up."""
    if prices is None:
        return 0
    whole = whole_rates(prices, ts, windows, off_peak_multiplier)
    if whole is not None:
        return prompt_tokens * whole[1] + completion_tokens * whole[2]
    miss, out = _rates(prices, is_peak(ts, windows), off_peak_multiplier)
    return prompt_tokens * miss + completion_tokens * out


def picousd_to_usd(pico: int) -> Decimal:
    return Decimal(pico) / Decimal(10**12)
