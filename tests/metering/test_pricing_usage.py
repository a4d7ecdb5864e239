"""Cost from the price table (docs/metering.md#prices) and token extraction from DeepSeek's usage
objects and SSE streams (docs/rules-chat.md#deepseeks-answers)."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from app.metering.cache import discount_picousd
from app.metering.pricing import cost_bound_picousd, cost_picousd, is_peak, picousd_to_usd, whole_rates
from app.metering.usage import TokenCounts, tokens_from_usage
from app.openai.chat import ChatFamily
from app.profiles import DEFAULT_PROFILES, FLASH_PRICES, PRO_PRICES, Prices
from app.settings import Settings

PEAK = Settings().pricing.peak_hours_utc
HALF = Settings().pricing.off_peak_multiplier


def at(hhmmss: str, day: str = "2026-11-30") -> float:
    return dt.datetime.fromisoformat(f"{day}T{hhmmss}+00:00").timestamp()


def test_default_peak_windows_are_the_documented_ones() -> None:
    """docs/metering.md#prices: peak 01:00-04:00 and 06:00-10:00 UTC; off-peak is half price."""
    assert PEAK == ["01:00-04:00", "06:00-10:00"]
    assert Decimal("0.5") == HALF


@pytest.mark.parametrize(
    ("clock", "peak"),
    [("00:59:59", False), ("01:00:00", True), ("03:59:59", True), ("04:00:00", False), ("05:59:59", False),
     ("06:00:00", True), ("09:59:59", True), ("10:00:00", False), ("23:30:00", False), ("12:00:00", False)],
)
def test_peak_window_boundaries(clock: str, peak: bool) -> None:
    assert is_peak(at(clock), PEAK) is peak


@given(st.floats(min_value=0, max_value=4.1e9, allow_nan=False))
def test_peak_minute_of_day_agrees_with_datetime(ts: float) -> None:
    t = dt.datetime.fromtimestamp(ts, dt.UTC)
    minute = t.hour * 60 + t.minute
    assert is_peak(ts, PEAK) is (60 <= minute < 240 or 360 <= minute < 600)


def test_peak_is_judged_in_utc_not_local_time() -> None:
    # 02:30 UTC is peak even when written with a +08:00 offset (10:30 Beijing).
    ts = dt.datetime.fromisoformat("2026-11-30T10:30:00+08:00").timestamp()
    assert is_peak(ts, PEAK)


def test_flash_cost_at_peak_prices_hit_miss_and_output_separately() -> None:
    """deepseek-flash peak: 0.006 hit / 0.30 miss / 1.20 output USD per 1M tokens."""
    tokens = TokenCounts(prompt_tokens=3000, completion_tokens=500, prompt_cache_hit_tokens=1000,
                         prompt_cache_miss_tokens=2000, reasoning_tokens=200)
    cost = cost_picousd(tokens, DEFAULT_PROFILES["deepseek-flash"].prices, at("02:00:00"), PEAK, HALF)
    # 1000*0.006 + 2000*0.30 + 500*1.20 = 6 + 600 + 600 = 1206 USD per 1M -> 1206e-6 USD
    assert cost == 1_206_000_000
    assert picousd_to_usd(cost) == Decimal("0.001206")


def test_off_peak_is_exactly_half_price() -> None:
    tokens = TokenCounts(3000, 500, 1000, 2000, 0)
    prices = DEFAULT_PROFILES["deepseek-flash"].prices
    assert cost_picousd(tokens, prices, at("11:00:00"), PEAK, HALF) == 603_000_000
    assert cost_picousd(tokens, prices, at("04:00:00"), PEAK, HALF) * 2 == cost_picousd(
        tokens, prices, at("03:59:00"), PEAK, HALF)


def test_cache_hits_are_priced_apart_from_misses() -> None:
    """Same prompt size, different cache split: the cheaper hit price must show in the cost."""
    all_miss = TokenCounts(1000, 0, 0, 1000, 0)
    all_hit = TokenCounts(1000, 0, 1000, 0, 0)
    ts = at("07:00:00")
    assert cost_picousd(all_miss, PRO_PRICES, ts, PEAK, HALF) == 1_320_000_000  # 1.32 USD/M
    assert cost_picousd(all_hit, PRO_PRICES, ts, PEAK, HALF) == 44_000_000  # 0.044 USD/M


def test_cost_counts_completion_tokens_once_reasoning_is_inside_them() -> None:
    """reasoning_tokens are part of completion_tokens: not billed a second time."""
    base = TokenCounts(10, 100, 0, 10, 0)
    with_reasoning = TokenCounts(10, 100, 0, 10, 90)
    ts = at("08:00:00")
    assert cost_picousd(base, FLASH_PRICES, ts, PEAK, HALF) == cost_picousd(with_reasoning, FLASH_PRICES, ts,
                                                                            PEAK, HALF)


def test_single_tokens_are_exact_integers_in_picousd() -> None:
    """One off-peak cache-hit token of flash = 0.003e-6 USD = 3000 picoUSD, no float rounding."""
    one_hit = TokenCounts(1, 0, 1, 0, 0)
    cost = cost_picousd(one_hit, FLASH_PRICES, at("12:00:00"), PEAK, HALF)
    assert type(cost) is int and cost == 3000
    # A million such records sum exactly (floats would drift: 0.003e-6 * 1e6 != 0.003 in binary).
    assert sum([cost] * 1_000_000) == 3_000_000_000
    assert picousd_to_usd(sum([cost] * 1_000_000)) == Decimal("0.003")


def test_pro_prices_with_fractional_cents() -> None:
    """deepseek-v4-pro off-peak: 0.022 / 0.66 / 1.98 (half of 0.044 / 1.32 / 3.96)."""
    tokens = TokenCounts(7, 3, 2, 5, 0)
    cost = cost_picousd(tokens, PRO_PRICES, at("20:00:00"), PEAK, HALF)
    expected = (2 * Decimal("0.022") + 5 * Decimal("0.66") + 3 * Decimal("1.98")) * 10**6
    assert cost == int(expected) and Decimal(cost) == expected


def test_unknown_model_costs_nothing() -> None:
    assert cost_picousd(TokenCounts(100, 100, 0, 100, 0), None, at("02:00:00"), PEAK, HALF) == 0


def test_custom_multiplier_and_windows() -> None:
    tokens, windows, quarter = TokenCounts(0, 1000, 0, 0, 0), ["12:00-13:00"], Decimal("0.25")
    assert cost_picousd(tokens, FLASH_PRICES, at("12:30:00"), windows, quarter) == 1_200_000_000
    assert cost_picousd(tokens, FLASH_PRICES, at("13:30:00"), windows, quarter) == 300_000_000


@pytest.mark.parametrize(
    ("clock", "peak"),
    [("21:59:59", False), ("22:00:00", True), ("23:59:59", True), ("00:00:00", True), ("01:59:59", True),
     ("02:00:00", False), ("12:00:00", False)],
)
def test_a_window_may_cross_midnight(clock: str, peak: bool) -> None:
    """"22:00-02:00" is 22:00 to midnight and midnight to 02:00."""
    assert is_peak(at(clock), ["22:00-02:00"]) is peak


@given(start=st.integers(0, 24 * 60 - 1), end=st.integers(0, 24 * 60), ts=st.integers(0, 4_100_000_000))
def test_peak_is_the_minutes_from_start_to_end_around_the_clock(start: int, end: int, ts: int) -> None:
    """Any window, crossing midnight or not: peak from its start, minute by minute (past 24:00 to 00:00),
    up to its end."""
    assume(start != end)  # refused by the settings
    window = f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"
    peak_minutes = {m % (24 * 60) for m in range(start, end if end > start else end + 24 * 60)}
    t = dt.datetime.fromtimestamp(ts, dt.UTC)
    assert is_peak(ts, [window]) is (t.hour * 60 + t.minute in peak_minutes)


def test_a_window_across_midnight_is_billed_and_reserved_at_peak_prices() -> None:
    """The record's cost and the bound a limit reserves (issue 15) both see the window past midnight."""
    tokens, windows = TokenCounts(1000, 1000, 0, 1000, 0), ["23:00-01:00"]
    for clock in ("23:30:00", "00:30:00"):
        assert cost_picousd(tokens, FLASH_PRICES, at(clock), windows, HALF) == 1_500_000_000
        assert cost_bound_picousd(1000, 1000, FLASH_PRICES, at(clock), windows, HALF) == 1_500_000_000
    assert cost_picousd(tokens, FLASH_PRICES, at("01:30:00"), windows, HALF) == 750_000_000
    assert cost_bound_picousd(1000, 1000, FLASH_PRICES, at("01:30:00"), windows, HALF) == 750_000_000


# --- tokens_from_usage -------------------------------------------------------------------------------


DEEPSEEK_USAGE = {
    "prompt_tokens": 120, "completion_tokens": 45, "total_tokens": 165,
    "prompt_tokens_details": {"cached_tokens": 64},
    "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 56,
    "completion_tokens_details": {"reasoning_tokens": 30},
}  # fmt: skip


def test_tokens_from_deepseek_usage() -> None:
    assert tokens_from_usage(DEEPSEEK_USAGE) == TokenCounts(120, 45, 64, 56, 30)


def test_deepseek_cache_fields_win_over_openai_details() -> None:
    usage = {**DEEPSEEK_USAGE, "prompt_tokens_details": {"cached_tokens": 1}}
    assert tokens_from_usage(usage) == TokenCounts(120, 45, 64, 56, 30)


def test_openai_cached_tokens_fallback_derives_the_miss_count() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 40}}
    assert tokens_from_usage(usage) == TokenCounts(100, 7, 40, 60, 0)


def test_usage_without_any_cache_field_is_all_miss() -> None:
    assert tokens_from_usage({"prompt_tokens": 9, "completion_tokens": 2}) == TokenCounts(9, 2, 0, 9, 0)


@pytest.mark.parametrize("usage", [None, [], "usage", 3])
def test_no_usage_object(usage: object) -> None:
    assert tokens_from_usage(usage) is None


def test_garbage_numbers_count_as_zero() -> None:
    usage = {"prompt_tokens": -5, "completion_tokens": True, "prompt_cache_hit_tokens": "3"}
    assert tokens_from_usage(usage) == TokenCounts(0, 0, 0, 0, 0)


def test_the_chat_family_reads_usage_from_an_answer() -> None:
    family = ChatFamily(Settings().policy())
    assert family.usage({"choices": [], "usage": DEEPSEEK_USAGE}) == TokenCounts(120, 45, 64, 56, 30)
    assert family.usage({"choices": []}) is None
    assert family.usage([1, 2]) is None


@given(prompt=st.integers(0, 2_000_000), completion=st.integers(0, 400_000),
       minute=st.integers(0, 24 * 60 - 1), pro=st.booleans(),
       half=st.sampled_from([Decimal("0.5"), Decimal("1"), Decimal("0.333")]))
def test_the_bound_a_limit_reserves_is_the_cost_rounded_up(prompt: int, completion: int, minute: int,
                                                            pro: bool, half: Decimal) -> None:
    """The integer bound of issue 15's reservations: never below what the same tokens cost (the prompt all
    cache misses), above it by less than a picodollar per token."""
    prices = PRO_PRICES if pro else FLASH_PRICES
    ts = 1_800_000_000 // 86400 * 86400 + minute * 60.0
    exact = cost_picousd(TokenCounts(prompt, completion, 0, prompt, 0), prices, ts, PEAK, half)
    bound = cost_bound_picousd(prompt, completion, prices, ts, PEAK, half)
    assert exact <= bound <= exact + prompt + completion
    assert cost_bound_picousd(prompt, completion, None, ts, PEAK, half) == 0


def _decimal_cost(tokens: TokenCounts, prices: Prices, ts: float, half: Decimal) -> int:
    """The cost as Decimal arithmetic gives it (the reference `whole_rates`' integers must equal)."""
    usd = (tokens.prompt_cache_hit_tokens * prices.input_cache_hit + tokens.prompt_cache_miss_tokens
           * prices.input_cache_miss + tokens.completion_tokens * prices.output)
    if not is_peak(ts, PEAK):
        usd *= half
    return int((usd * Decimal(1_000_000)).to_integral_value(ROUND_HALF_UP))


_PRICE = st.decimals(min_value=0, max_value=100, places=7, allow_nan=False, allow_infinity=False)


@given(hit=st.integers(0, 2_000_000), miss=st.integers(0, 2_000_000), completion=st.integers(0, 400_000),
       minute=st.integers(0, 24 * 60 - 1), listed=st.sampled_from([FLASH_PRICES, PRO_PRICES, None]),
       own=st.tuples(_PRICE, _PRICE, _PRICE),
       half=st.sampled_from([Decimal("0.5"), Decimal("1"), Decimal("0.333"), Decimal("0.25")]))
def test_the_integer_rates_give_the_decimal_cost_to_the_picodollar(
        hit: int, miss: int, completion: int, minute: int, listed: Prices | None,
        own: tuple[Decimal, Decimal, Decimal], half: Decimal) -> None:
    """A cost, a saving and a bound are integer arithmetic when the prices per token are whole picodollars
    (every listed price, half price off-peak), the Decimal arithmetic otherwise: the same picodollars."""
    prices = listed if listed is not None else Prices(*own)
    ts = 1_800_000_000 // 86400 * 86400 + minute * 60.0 + 17.5
    tokens = TokenCounts(hit + miss, completion, hit, miss, 0)
    assert cost_picousd(tokens, prices, ts, PEAK, half) == _decimal_cost(tokens, prices, ts, half)
    scale = Decimal(1_000_000) * (1 if is_peak(ts, PEAK) else half)
    saved = hit * (prices.input_cache_miss - prices.input_cache_hit) * scale
    assert discount_picousd(hit, prices, ts, PEAK, half) == int(saved.to_integral_value(ROUND_HALF_UP))
    ceil_miss, ceil_out = ((p * scale).to_integral_value(ROUND_CEILING) for p in (prices.input_cache_miss,
                                                                              prices.output))
    assert cost_bound_picousd(hit + miss, completion, prices, ts, PEAK, half) == \
        (hit + miss) * int(ceil_miss) + completion * int(ceil_out)


def test_whole_rates_are_the_listed_prices_in_picodollars_and_none_for_finer_prices() -> None:
    assert whole_rates(FLASH_PRICES, at("02:00:00"), PEAK, HALF) == (6_000, 300_000, 1_200_000)
    assert whole_rates(FLASH_PRICES, at("12:00:00"), PEAK, HALF) == (3_000, 150_000, 600_000)
    finer = Prices(Decimal("0.0000001"), Decimal("0.30"), Decimal("1.20"))
    assert whole_rates(finer, at("02:00:00"), PEAK, HALF) is None
    # remembered per minute and per price table: another table in the same minute has its own rates
    assert whole_rates(PRO_PRICES, at("02:00:00"), PEAK, HALF) == (44_000, 1_320_000, 3_960_000)
    assert whole_rates(FLASH_PRICES, at("02:00:30"), PEAK, HALF) == (6_000, 300_000, 1_200_000)
    assert whole_rates(FLASH_PRICES, at("04:00:00"), PEAK, HALF) == (3_000, 150_000, 600_000)
