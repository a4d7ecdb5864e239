"""What a request costs: one tariff per model and currency, built from the catalogue
(chatgate/metering/catalogue.toml) and the configuration when the app starts (`build_pricing`), and the peak
calendar (docs/metering.md#prices).

Pricing a record is a dict look-up, the calendar's answer for its minute and integer arithmetic: every
listed price, per token, is a whole number of pico-units (1e-12 of the currency); a finer configured price
goes through Decimal, rounded half up to the pico-unit.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from chatgate.metering.calendar import PeakCalendar
from chatgate.metering.catalogue import CURRENCIES, CallPrice, Catalogue, PriceRow, Step, Triple, catalogue
from chatgate.metering.usage import TokenCounts

PICO_PER_UNIT_PER_MTOK = Decimal(1_000_000)  # a price per 1M tokens -> pico-units per token
PICO = Decimal(10**12)
HALF = Decimal("0.5")  # DeepSeek's off-peak: half of peak (a configured override's off-peak price)


@dataclass(frozen=True, slots=True)
class Rates:
    """Pico-units per cache-hit, cache-miss and output token in one period. `whole`: the three are whole
    numbers and `hit`, `miss`, `output` are them; otherwise those are rounded up (for a reservation's
    bound) and `exact` has the Decimal values."""

    hit: int
    miss: int
    output: int
    whole: bool
    exact: Triple

    @staticmethod
    def of(per_mtok: Triple) -> Rates:
        exact = per_mtok.times(PICO_PER_UNIT_PER_MTOK)
        whole = all(v == v.to_integral_value() for v in exact)
        up = [int(v.to_integral_value(ROUND_CEILING)) for v in exact]
        return Rates(up[0], up[1], up[2], whole, exact)

    def cost(self, tokens: TokenCounts) -> int:
        if self.whole:
            return (tokens.prompt_cache_hit_tokens * self.hit + tokens.prompt_cache_miss_tokens * self.miss
                    + tokens.completion_tokens * self.output)
        e = self.exact
        pico = (tokens.prompt_cache_hit_tokens * e.hit + tokens.prompt_cache_miss_tokens * e.miss
                + tokens.completion_tokens * e.output)
        return int(pico.to_integral_value(ROUND_HALF_UP))

    def bound(self, prompt_tokens: int, completion_tokens: int) -> int:
        """An upper bound of `cost` for this many tokens, all of the prompt a cache miss."""
        return prompt_tokens * self.miss + completion_tokens * self.output

    def discount(self, tokens: int) -> int:
        """What `tokens` prompt tokens cost as misses minus as hits."""
        if tokens <= 0:
            return 0
        if self.whole:
            return tokens * (self.miss - self.hit)
        return int((tokens * (self.exact.miss - self.exact.hit)).to_integral_value(ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class Period:
    """One step of a tariff: its prices (per 1M tokens) and rates, peak and off-peak."""

    step: Step
    row: PriceRow
    peak: Rates
    off_peak: Rates


class Tariff:
    """One model's prices in one currency over time. A step without a price in this currency is None: the
    model is unpriced then."""

    __slots__ = ("_since", "currency", "last", "last_since", "model", "periods")

    def __init__(self, model: str, currency: str, periods: list[tuple[float, Period | None]]) -> None:
        self.model = model
        self.currency = currency
        self.periods = periods
        self._since = [since for since, _ in periods]
        self.last_since, self.last = periods[-1]  # the step in force now

    def period(self, ts: float) -> Period | None:
        if ts >= self.last_since:  # (nearly) every record is priced by the latest step
            return self.last
        i = bisect.bisect_right(self._since, ts) - 1
        return self.periods[i][1] if i >= 0 else None

    def rates(self, ts: float, peak: bool) -> Rates | None:
        period = self.period(ts)
        if period is None:
            return None
        return period.peak if peak else period.off_peak


class Pricing:
    """The tariffs in force, for one currency: built once when the settings load (`build_pricing`)."""

    def __init__(self, currency: str, calendar: PeakCalendar, tariffs: dict[str, Tariff],
                 source: Catalogue) -> None:
        self.currency = currency
        self.calendar = calendar
        self.tariffs = tariffs
        self.catalogue = source
        self.ceiling = _ceiling(currency, list(tariffs.values()))
        known = [p.row.peak for _, p in self.ceiling.periods if p is not None]
        zero = Triple(Decimal(0), Decimal(0), Decimal(0))
        self.highest = Rates.of(Triple(*(max(v) for v in zip(*known, strict=True))) if known else zero)

    def rates(self, model: str, ts: float) -> Rates | None:
        """The model's rates at `ts` (its step and the calendar's period); None: no price then. On every
        request: Tariff.period and PeakCalendar.is_peak inlined for their common case."""
        tariff = self.tariffs.get(model)
        if tariff is None:
            return None
        period = tariff.last if ts >= tariff.last_since else tariff.period(ts)
        if period is None:
            return None
        minute, peak = self.calendar.last
        if minute != int(ts // 60):
            peak = self.calendar.is_peak(ts)
        return period.peak if peak else period.off_peak

    def ceiling_rates(self, ts: float) -> Rates:
        """The highest price of the catalogue at `ts`, each of hit, miss and output (for an unpriced model:
        docs/metering.md#models-without-a-price); at a time without any price in this currency, the highest
        of all times."""
        rates = self.ceiling.rates(ts, self.calendar.is_peak(ts))
        return rates if rates is not None else self.highest

    def cost(self, tokens: TokenCounts, model: str, ts: float) -> int:
        """The record's cost in pico-units; an unpriced model at the ceiling."""
        rates = self.rates(model, ts)
        return (rates if rates is not None else self.ceiling_rates(ts)).cost(tokens)

    def bound(self, prompt_tokens: int, completion_tokens: int, model: str, ts: float) -> int:
        rates = self.rates(model, ts)
        if rates is None:
            rates = self.ceiling_rates(ts)
        return rates.bound(prompt_tokens, completion_tokens)

    def call_cost(self, tool: str, units: int, ts: float, made_by_model: bool = False) -> int | None:
        return call_cost(tool, units, ts, self.currency, made_by_model)


def _ceiling(currency: str, tariffs: list[Tariff]) -> Tariff:
    """A tariff whose every step is the highest hit, miss and output price of `tariffs` then."""
    times = sorted({since for t in tariffs for since in t._since})
    periods: list[tuple[float, Period | None]] = []
    for since in times:
        found = [p for t in tariffs if (p := t.period(since)) is not None]
        if not found:
            periods.append((since, None))
            continue
        peak = Triple(*(max(v) for v in zip(*(p.row.peak for p in found), strict=True)))
        off = Triple(*(max(v) for v in zip(*(p.row.off_peak for p in found), strict=True)))
        row = PriceRow(peak, off, False)
        step = Step(since, "ceiling", "the highest price of the catalogue", "", {currency: row})
        periods.append((since, Period(step, row, Rates.of(peak), Rates.of(off))))
    if not periods or periods[0][0] != float("-inf"):
        periods.insert(0, (float("-inf"), None))
    return Tariff("(ceiling)", currency, periods)


def _period(step: Step, currency: str, multiplier: Decimal | None) -> Period | None:
    row = step.prices.get(currency)
    if row is None:
        return None
    if multiplier is not None and not row.flat:
        row = PriceRow(row.peak, row.peak.times(multiplier), False)
    return Period(step, row, Rates.of(row.peak), Rates.of(row.off_peak))


@dataclass(frozen=True, slots=True)
class Override:
    """A model's configured peak prices per 1M tokens (hit, miss, output; None: the catalogue's, 0 for a
    model it does not know) by currency, in force from `since` (None: always)."""

    prices: dict[str, tuple[Decimal | None, Decimal | None, Decimal | None]]
    since: float | None = None


def _override_steps(model: str, steps: tuple[Step, ...], o: Override | None, half: Decimal
                    ) -> tuple[Step, ...]:
    """The model's steps with its configured prices from `since`: each currency with a price given."""
    if o is None or not any(v is not None for values in o.prices.values() for v in values):
        return steps
    since = o.since if o.since is not None else float("-inf")
    before = [s for s in steps if s.since < since]
    base = before[-1] if before else (steps[0] if steps else None)
    prices: dict[str, PriceRow] = dict(base.prices) if base is not None else {}
    zero = Triple(Decimal(0), Decimal(0), Decimal(0))
    for currency, values in o.prices.items():
        if all(v is None for v in values):
            continue
        known = prices[currency].peak if currency in prices else zero
        peak = Triple(*(v if v is not None else known_v for v, known_v in zip(values, known, strict=True)))
        prices[currency] = PriceRow(peak, peak.times(half), False)
    override = Step(since, "config", f'[models."{model}"]', "configuration", prices)
    return (*before, override)


def _tariff(model: str, steps: tuple[Step, ...], currency: str, multiplier: Decimal | None) -> Tariff | None:
    periods = [(s.since, _period(s, currency, multiplier)) for s in steps]
    if all(p is None for _, p in periods):
        return None
    if periods[0][0] != float("-inf"):  # before the first step: no price
        periods.insert(0, (float("-inf"), None))
    return Tariff(model, currency, periods)


def build_calendar(windows: Iterable[str] | None = None, holidays: Iterable[date] = (),
                   peak_days: Iterable[date] = ()) -> PeakCalendar:
    """The catalogue's calendar, its windows replaced by `windows` if given, with more holidays and peak
    days."""
    cal = catalogue().calendar
    return PeakCalendar(windows if windows is not None else cal.windows_utc, cal.peak_since,
                        cal.weekdays_since, (*cal.holidays, *holidays), peak_days)


def build_pricing(currency: str, calendar: PeakCalendar, multiplier: Decimal | None = None,
                  overrides: Mapping[str, Override] | None = None) -> Pricing:
    """Every model's tariff in `currency` ("USD" or "CNY"), from the catalogue and the configured prices
    (`multiplier`: off-peak = peak x it for every peak/off-peak row; None: the catalogue's off-peak)."""
    if currency not in CURRENCIES:
        raise ValueError(f"currency must be one of {CURRENCIES}, got {currency!r}")
    source = catalogue()
    overrides = overrides or {}
    half = multiplier if multiplier is not None else HALF
    tariffs = {}
    for model in {*source.models, *overrides}:
        steps = _override_steps(model, source.models.get(model, ()), overrides.get(model), half)
        tariff = _tariff(model, steps, currency, multiplier) if steps else None
        if tariff is not None:
            tariffs[model] = tariff
    return Pricing(currency, calendar, tariffs, source)


def call_cost(tool: str, units: int, ts: float, currency: str, made_by_model: bool = False) -> int | None:
    """What `units` billed units of a tool (`search`, `fetch`: successful calls; `ocr`: pages; `tts`:
    characters) cost at `ts`, in pico-units of `currency`; None where no price is published (the tool,
    the currency, or a time before the API opened). Searches and fetches the model makes (`made_by_model`)
    are free before 2026-11-01 00:00 Beijing."""
    price: CallPrice | None = catalogue().calls.get(tool)
    if price is None or currency not in price.prices or ts < price.since:
        return None
    if made_by_model and (price.model_made_since is None or ts < price.model_made_since):
        return 0
    pico = units * price.prices[currency] * PICO / price.per
    return int(pico.to_integral_value(ROUND_HALF_UP))


def to_units(pico: int) -> Decimal:
    """Pico-units as units of the currency (dollars, yuan)."""
    return Decimal(pico) / PICO

