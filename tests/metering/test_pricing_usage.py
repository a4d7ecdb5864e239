"""Cost from the price catalogue (docs/metering.md#prices) and token extraction from DeepSeek's usage
objects and SSE streams (docs/rules-chat.md#deepseeks-answers)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatgate.metering.calendar import PeakCalendar
from chatgate.metering.catalogue import Triple, catalogue
from chatgate.metering.pricing import Override, Pricing, Rates, build_calendar, build_pricing, call_cost
from chatgate.metering.usage import TokenCounts, tokens_from_usage
from chatgate.openai.chat import ChatFamily
from chatgate.settings import Settings
from tests.metering.helpers import cli

USD = Settings().pricing_book("USD")
CNY = Settings().pricing_book("CNY")


def at(hhmmss: str, day: str = "2026-11-30") -> float:
    """2026-11-30 is a Monday."""
    return dt.datetime.fromisoformat(f"{day}T{hhmmss}+00:00").timestamp()


def test_default_peak_windows_are_the_documented_ones() -> None:
    """docs/metering.md#prices: peak 01:00-04:00 and 06:00-10:00 UTC; off-peak is half price."""
    assert USD.calendar.windows == ("01:00-04:00", "06:00-10:00")
    flash = USD.tariffs["deepseek-flash"].period(at("12:00:00"))
    assert flash is not None and flash.row.off_peak == flash.row.peak.times(Decimal("0.5"))


@pytest.mark.parametrize(
    ("clock", "peak"),
    [("00:59:59", False), ("01:00:00", True), ("03:59:59", True), ("04:00:00", False), ("05:59:59", False),
     ("06:00:00", True), ("09:59:59", True), ("10:00:00", False), ("23:30:00", False), ("12:00:00", False)],
)
def test_peak_window_boundaries_on_a_weekday(clock: str, peak: bool) -> None:
    assert USD.calendar.is_peak(at(clock)) is peak


@pytest.mark.parametrize(
    ("day", "peak"),
    [("2026-11-28", False), ("2026-11-29", False),  # Saturday, Sunday: off-peak all day (§13.4)
     ("2026-11-27", True), ("2026-11-30", True),  # Friday, Monday
     ("2026-10-01", False), ("2026-10-07", False), ("2026-09-25", False),  # 国庆节, 中秋节 (weekdays)
     ("2026-10-08", True),
     ("2026-10-10", False), ("2026-09-20", False),  # make-up working days (调休) on a weekend: off-peak
     ("2026-08-22", True),  # a Saturday before 2026-08-23 00:00 Beijing: the windows applied every day
     ("2026-08-29", False)],
)
def test_weekends_and_chinese_public_holidays_are_off_peak_all_day(day: str, peak: bool) -> None:
    for clock in ("01:30:00", "08:00:00"):
        assert USD.calendar.is_peak(at(clock, day)) is peak, (day, clock)
    assert USD.calendar.is_peak(at("12:00:00", day)) is False


def test_the_weekday_is_the_beijing_date() -> None:
    """2026-10-08 (a Thursday after National Day) 01:30 UTC is 09:30 Beijing on the 8th: peak; 2026-09-30
    23:30 UTC is already 10-01 in Beijing (a holiday), and outside the windows anyway."""
    cal = PeakCalendar(["00:00-24:00"], 0, 0, catalogue().calendar.holidays)
    assert cal.is_peak(at("15:59:00", "2026-09-30")) is True
    assert cal.is_peak(at("16:00:00", "2026-09-30")) is False  # 10-01 00:00 Beijing
    assert cal.is_peak(at("16:00:00", "2026-10-07")) is True  # 10-08 00:00 Beijing


def test_configured_holidays_and_peak_days() -> None:
    cal = build_calendar(None, [dt.date(2026, 12, 1)], [dt.date(2026, 10, 10)])
    assert cal.is_peak(at("02:00:00", "2026-12-01")) is False
    assert cal.is_peak(at("02:00:00", "2026-10-10")) is True  # a make-up Saturday, configured as peak


@given(st.floats(min_value=at("00:00:00", "2026-08-23"), max_value=4.1e9, allow_nan=False))
def test_peak_agrees_with_datetime(ts: float) -> None:
    t = dt.datetime.fromtimestamp(ts, dt.UTC)
    beijing = dt.datetime.fromtimestamp(ts + 8 * 3600, dt.UTC).date()
    minute = t.hour * 60 + t.minute
    weekday = beijing.weekday() < 5 and beijing not in catalogue().calendar.holidays
    assert USD.calendar.is_peak(ts) is (weekday and (60 <= minute < 240 or 360 <= minute < 600))


def test_next_peak_window() -> None:
    cal = USD.calendar
    assert cal.next_peak(at("12:00:00", "2026-12-05")) == (at("01:00:00", "2026-12-07"),
                                                           at("04:00:00", "2026-12-07"))
    assert cal.next_peak(at("02:30:00", "2026-12-07")) == (at("01:00:00", "2026-12-07"),
                                                           at("04:00:00", "2026-12-07"))
    assert cal.next_peak(at("04:00:00", "2026-12-07")) == (at("06:00:00", "2026-12-07"),
                                                           at("10:00:00", "2026-12-07"))
    assert cal.next_peak(at("12:00:00", "2026-09-30")) == (at("01:00:00", "2026-10-08"),
                                                           at("04:00:00", "2026-10-08"))


def test_flash_cost_at_peak_prices_hit_miss_and_output_separately() -> None:
    """deepseek-flash peak: 0.006 hit / 0.30 miss / 1.20 output USD per 1M tokens."""
    tokens = TokenCounts(prompt_tokens=3000, completion_tokens=500, prompt_cache_hit_tokens=1000,
                         prompt_cache_miss_tokens=2000, reasoning_tokens=200)
    cost = USD.cost(tokens, "deepseek-flash", at("02:00:00"))
    # 1000*0.006 + 2000*0.30 + 500*1.20 = 6 + 600 + 600 = 1206 USD per 1M -> 1206e-6 USD
    assert cost == 1_206_000_000


def test_off_peak_is_exactly_half_price() -> None:
    tokens = TokenCounts(3000, 500, 1000, 2000, 0)
    assert USD.cost(tokens, "deepseek-flash", at("11:00:00")) == 603_000_000
    assert USD.cost(tokens, "deepseek-flash", at("04:00:00")) * 2 == USD.cost(tokens, "deepseek-flash",
                                                                              at("03:59:00"))


def test_yuan_from_its_own_table() -> None:
    """0.02 元 per 1M cache-hit tokens off-peak (the seed's "big saver"), 8 元 per 1M output at peak: never
    USD times a rate."""
    hits = TokenCounts(1_000_000, 0, 1_000_000, 0, 0)
    assert CNY.cost(hits, "deepseek-flash", at("12:00:00")) == 20_000_000_000  # 0.02 元
    assert CNY.cost(TokenCounts(0, 1_000_000, 0, 0, 0), "deepseek-flash", at("02:00:00")) == 8 * 10**12
    assert CNY.cost(TokenCounts(0, 1_000_000, 0, 0, 0), "deepseek-v4-pro", at("02:00:00")) == 27 * 10**12


def test_a_record_is_priced_at_the_price_of_its_time() -> None:
    """deepseek-chat: V3 (0.27 miss) until 2025-09-05, V3.2 (0.28 / 0.42) from 2025-09-29, flash today;
    the same tokens, three prices."""
    miss_and_out = TokenCounts(1_000_000, 1_000_000, 0, 1_000_000, 0)
    assert USD.cost(miss_and_out, "deepseek-chat", at("12:00:00", "2025-06-02")) == (27 + 110) * 10**10
    assert USD.cost(miss_and_out, "deepseek-chat", at("12:00:00", "2025-12-01")) == (28 + 42) * 10**10
    assert USD.cost(miss_and_out, "deepseek-chat", at("12:00:00")) == (15 + 60) * 10**10
    # deepseek-flash's price starts 2026-09-10 04:00 UTC; before, v4-flash's
    assert USD.rates("deepseek-flash", at("03:59:00", "2026-09-10")) is None
    assert USD.cost(miss_and_out, "deepseek-v4-flash", at("12:00:00", "2026-09-01")) == (22 + 66) * 10**10


def test_a_currency_not_published_is_absent_not_converted() -> None:
    assert CNY.rates("deepseek-chat", at("12:00:00", "2025-06-02")) is None
    assert CNY.rates("deepseek-v4-flash", at("12:00:00", "2026-09-01")) is None
    assert CNY.rates("deepseek-v4-pro", at("12:00:00", "2026-09-01")) is not None


def test_cache_hits_are_priced_apart_from_misses() -> None:
    all_miss = TokenCounts(1000, 0, 0, 1000, 0)
    all_hit = TokenCounts(1000, 0, 1000, 0, 0)
    ts = at("07:00:00")
    assert USD.cost(all_miss, "deepseek-v4-pro", ts) == 1_320_000_000  # 1.32 USD/M
    assert USD.cost(all_hit, "deepseek-v4-pro", ts) == 44_000_000  # 0.044 USD/M


def test_single_tokens_are_exact_integers_in_picousd() -> None:
    """One off-peak cache-hit token of flash = 0.003e-6 USD = 3000 picoUSD, no float rounding."""
    cost = USD.cost(TokenCounts(1, 0, 1, 0, 0), "deepseek-flash", at("12:00:00"))
    assert type(cost) is int and cost == 3000
    assert sum([cost] * 1_000_000) == 3_000_000_000


def test_an_unknown_model_is_priced_at_the_catalogues_highest_price() -> None:
    """issue 48, finding 5: never 0. v4-pro's miss and output are the highest in force today."""
    tokens = TokenCounts(100, 100, 0, 100, 0)
    assert USD.rates("my-own-model", at("02:00:00")) is None
    assert USD.cost(tokens, "my-own-model", at("02:00:00")) == 100 * 1_320_000 + 100 * 3_960_000
    assert USD.bound(100, 100, "my-own-model", at("12:00:00")) == 100 * 660_000 + 100 * 1_980_000
    assert CNY.cost(tokens, "my-own-model", at("02:00:00")) == 100 * 9_000_000 + 100 * 27_000_000


def _book(**models: dict[str, str]) -> Pricing:
    settings = Settings.model_validate({"models": models})
    return settings.pricing_book("USD")


def test_configured_prices_with_and_without_a_date() -> None:
    tokens = TokenCounts(0, 1000, 0, 0, 0)
    always = _book(**{"deepseek-flash": {"price_output": "2.00"}})
    assert always.cost(tokens, "deepseek-flash", at("02:00:00")) == 2_000_000_000
    assert always.cost(tokens, "deepseek-flash", at("12:00:00")) == 1_000_000_000  # half off-peak
    dated = _book(**{"deepseek-flash": {"price_output": "2.00", "price_since": "2026-12-01"}})
    assert dated.cost(tokens, "deepseek-flash", at("02:00:00")) == 1_200_000_000  # the catalogue's
    assert dated.cost(tokens, "deepseek-flash", at("02:00:00", "2026-12-01")) == 2_000_000_000
    own = _book(**{"my-model": {"price_input_cache_miss": "1", "price_output": "1"}})
    assert own.cost(TokenCounts(10, 10, 0, 10, 0), "my-model", at("02:00:00")) == 20_000_000
    cny = Settings.model_validate({"models": {"my-model": {"price_cny_output": "3"}}}).pricing_book("CNY")
    assert cny.cost(tokens, "my-model", at("02:00:00")) == 3_000_000_000
    assert own.rates("my-model", at("02:00:00")) is not None
    assert Settings.model_validate({"models": {"my-model": {"price_output": "3"}}}).pricing_book(
        "CNY").rates("my-model", at("02:00:00")) is None


def test_custom_multiplier_and_windows() -> None:
    settings = Settings.model_validate({"pricing": {"peak_hours_utc": ["12:00-13:00"],
                                                    "off_peak_multiplier": "0.25"}})
    book = settings.pricing_book("USD")
    tokens = TokenCounts(0, 1000, 0, 0, 0)
    assert book.cost(tokens, "deepseek-flash", at("12:30:00")) == 1_200_000_000
    assert book.cost(tokens, "deepseek-flash", at("13:30:00")) == 300_000_000
    # flat rows (before peak hours existed) are not multiplied
    assert book.cost(tokens, "deepseek-chat", at("13:30:00", "2025-06-02")) == 1_100_000_000


@pytest.mark.parametrize(
    ("clock", "peak"),
    [("21:59:59", False), ("22:00:00", True), ("23:59:59", True), ("00:00:00", True), ("01:59:59", True),
     ("02:00:00", False), ("12:00:00", False)],
)
def test_a_window_may_cross_midnight(clock: str, peak: bool) -> None:
    """"22:00-02:00" is 22:00 to midnight and midnight to 02:00 (Tuesday 2026-12-01 in UTC)."""
    cal = build_calendar(["22:00-02:00"])
    assert cal.is_peak(at(clock, "2026-12-01")) is peak


def test_per_call_prices() -> None:
    """Search and fetch $0.75 / 5 元 per 1,000 successful calls; OCR 1.5 元 per 1,000 pages (no USD price
    published: None); model-made searches free before 2026-11-01 00:00 Beijing."""
    now = at("12:00:00")
    assert call_cost("search", 1, now, "USD") == 750_000_000
    assert call_cost("fetch", 1000, now, "CNY") == 5 * 10**12
    assert call_cost("ocr", 1000, now, "CNY") == 1_500_000_000_000
    assert call_cost("ocr", 1000, now, "USD") is None
    assert call_cost("tts", 10_000, now, "CNY") == 3 * 10**12
    assert call_cost("asr", 1, now, "CNY") is None
    assert call_cost("search", 1, at("15:59:59", "2026-10-31"), "USD", made_by_model=True) == 0
    assert call_cost("search", 1, at("16:00:00", "2026-10-31"), "USD", made_by_model=True) == 750_000_000
    assert USD.call_cost("search", 2, now) == 1_500_000_000


def test_the_catalogue_cites_a_source_for_every_row() -> None:
    data = catalogue()
    for model, steps in data.models.items():
        assert steps, model
        for step in steps:
            assert step.source and step.prices, (model, step.row)
            for row in step.prices.values():
                assert row.flat or row.off_peak == row.peak.times(Decimal("0.5")), (model, step.row)
    assert len(data.calendar.holidays) == 33 and dt.date(2026, 2, 17) in data.calendar.holidays


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


_PRICE = st.decimals(min_value=0, max_value=100, places=7, allow_nan=False, allow_infinity=False)
LISTED = [Triple(*map(Decimal, prices)) for prices in (("0.006", "0.30", "1.20"), ("0.022", "0.66", "1.98"),
                                                       ("0.003625", "0.435", "0.87"), ("0.02", "1", "4"))]


@given(hit=st.integers(0, 2_000_000), miss=st.integers(0, 2_000_000), completion=st.integers(0, 400_000),
       listed=st.sampled_from([*LISTED, None]), own=st.tuples(_PRICE, _PRICE, _PRICE),
       half=st.sampled_from([Decimal("0.5"), Decimal("1"), Decimal("0.333"), Decimal("0.25")]))
def test_the_integer_rates_give_the_decimal_cost_to_the_picounit(
        hit: int, miss: int, completion: int, listed: Triple | None, own: tuple[Decimal, Decimal, Decimal],
        half: Decimal) -> None:
    """A cost, a saving and a bound are integer arithmetic when the prices per token are whole pico-units
    (every listed price, half price off-peak), the Decimal arithmetic otherwise: the same pico-units."""
    prices = (listed if listed is not None else Triple(*own)).times(half)
    rates = Rates.of(prices)
    tokens = TokenCounts(hit + miss, completion, hit, miss, 0)
    exact = (hit * prices.hit + miss * prices.miss + completion * prices.output) * Decimal(1_000_000)
    assert rates.cost(tokens) == int(exact.to_integral_value(ROUND_HALF_UP))
    saved = hit * (prices.miss - prices.hit) * Decimal(1_000_000)
    assert rates.discount(hit) == (int(saved.to_integral_value(ROUND_HALF_UP)) if hit else 0)
    ceil_miss, ceil_out = ((p * Decimal(1_000_000)).to_integral_value(ROUND_CEILING) for p in (prices.miss,
                                                                                             prices.output))
    assert rates.bound(hit + miss, completion) == (hit + miss) * int(ceil_miss) + completion * int(ceil_out)
    assert rates.cost(TokenCounts(hit + miss, completion, 0, hit + miss, 0)) <= rates.bound(hit + miss,
                                                                                            completion)
    if listed is not None and half == 1:
        assert rates.whole


def test_a_tariff_is_built_once_and_pricing_is_a_lookup() -> None:
    """One tariff per model and currency, built with the settings; a price override changes the book, not
    a module cache."""
    book = build_pricing("USD", build_calendar(), None, {"deepseek-flash": Override({"USD": (None, None,
                                                                                         Decimal("9"))})})
    assert book.tariffs["deepseek-flash"] is book.tariffs["deepseek-flash"]
    assert book.cost(TokenCounts(0, 1, 0, 0, 0), "deepseek-flash", at("02:00:00")) == 9_000_000
    assert USD.cost(TokenCounts(0, 1, 0, 0, 0), "deepseek-flash", at("02:00:00")) == 1_200_000


@pytest.mark.slow  # runs the CLI as a process
def test_chatgate_prices_prints_the_table_the_calendar_and_the_next_peak(tmp_path: Any) -> None:
    """`chatgate prices --at`: the rows in force then with their sources and dates, the calendar, the
    holidays and the next peak window (after National Day: Thursday 2026-10-08 01:00 UTC)."""
    out = cli("prices", "--at", "2026-10-03T12:00:00Z", "--currency", "both", "--format", "json")
    table = json.loads(out.stdout)
    flash = {m["currency"]: m for m in table["models"] if m["model"] == "deepseek-flash"}
    assert flash["USD"]["peak"] == {"cache_hit": "0.006", "cache_miss": "0.30", "output": "1.20"}
    assert flash["CNY"]["off_peak"] == {"cache_hit": "0.02", "cache_miss": "1", "output": "4"}
    assert flash["USD"]["since"] == "2026-09-10T04:00:00Z" and "NEWS-260910" in flash["USD"]["source"]
    assert "deepseek-v4-flash" not in table["unpriced"].get("USD", [])
    assert table["calendar"]["next_peak"] == {"start": "2026-10-08T01:00:00Z", "end": "2026-10-08T04:00:00Z"}
    assert "2026-10-01" in table["calendar"]["holidays"] and table["calendar"]["peak_now"] is False
    config = tmp_path / "c.toml"
    config.write_text('[pricing]\ncurrency = "CNY"\nholidays = ["2026-10-08"]\n')
    text = cli("prices", "--at", "2026-10-03T12:00:00Z", "--config", str(config)).stdout
    assert "¥0.04 / ¥2 / ¥8" in text and "$" not in text.split("Per call:")[0]
    assert "next peak window 2026-10-09T01:00:00Z to 2026-10-09T04:00:00Z" in text
    bad = cli("prices", "--at", "the-day-before", check=False)
    assert bad.returncode == 2 and "--at" in bad.stderr
