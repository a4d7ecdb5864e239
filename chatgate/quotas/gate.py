"""Admission and settlement: the one place a request's limits are enforced.

`admit` finds the limits of the caller's key and team; a caller with none costs two cache look-ups. It
reserves the request's upper bounds (tokens: prompt bytes + 384 per image + max_tokens; cost: those tokens
at the cache-miss and output prices of the hour) against the rate and concurrency counters and every
budget, all or nothing. `settle`, once the request ends, replaces the reservations with what it used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from redis.exceptions import RedisError

from chatgate.bounded import BoundedDict
from chatgate.errors import APIError
from chatgate.metering.catalogue import SYMBOLS
from chatgate.quotas.alerts import Alerts
from chatgate.quotas.book import LimitBook
from chatgate.quotas.budgets import LocalBudgets, StoreBudgets
from chatgate.quotas.model import Admission, Ask, Plan, Refusal, Subject
from chatgate.quotas.periods import period_end, period_start
from chatgate.quotas.rates import LocalRates
from chatgate.quotas.redis_rates import RedisRates
from chatgate.settings import Settings
from chatgate.store.base import Hold, LimitRow, Store, StoreError

PICO_PER_USD = Decimal(10**12)
PLANS_CACHED = 10_000  # callers (team, key) whose worked-out limits are kept
log = logging.getLogger("chatgate.quotas")

BACKEND_ERRORS = (StoreError, RedisError, OSError, TimeoutError)


@dataclass(slots=True)
class Known:
    """A caller's plan, from its team's and key's rows, while the book hands out both (`until`, on the book's
    clock, and no row forgotten since: `generation`)."""

    rows: tuple[LimitRow | None, LimitRow | None]
    plan: Plan
    until: float
    generation: int


@dataclass(frozen=True, slots=True)
class BudgetGauge:
    """One budget's state for /metrics (amounts in pico-units of `currency`)."""

    scope: str
    subject: str
    period: str
    currency: str
    limit: int
    spent: int | None
    held: int | None


class Quotas:
    def __init__(self, settings: Settings, store: Store | None, clock: Callable[[], float] = time.time,
                 currency: str = "USD") -> None:
        limits = settings.limits
        self.settings = settings
        self.currency = currency  # of the prices, and so of every budget (docs/keys-and-limits.md)
        self.symbol = SYMBOLS[currency]
        self.store = store
        self.clock = clock
        self.book = LimitBook(store, limits.cache_seconds)
        self.rates: LocalRates | RedisRates = (
            RedisRates(limits.redis_url, timeout=limits.redis_timeout_s,
                       connect_timeout=limits.redis_connect_timeout_s)
            if limits.redis_url is not None else LocalRates())
        several = settings.server.workers > 1  # worker processes share nothing but the store and Redis
        shared = limits.budgets == "store" or (limits.budgets == "auto" and store is not None
                                               and (several or store.server))
        self.per_process_rates = several and limits.redis_url is None  # said once, when a rate applies
        # rates counted in this process: settling needs no I/O then (budgets never do: a lease's spend is
        # flushed by its keeper)
        self.in_process = isinstance(self.rates, LocalRates)
        self.hold_seconds = settings.upstream.total_timeout + 60
        self.budgets: LocalBudgets | StoreBudgets = (StoreBudgets(store, self.hold_seconds, clock)
                                                     if shared and store is not None else LocalBudgets(store))
        self.alerts = Alerts(settings.alerts, store, currency)
        self.fail_open = limits.on_backend_error == "fail_open"
        self._ids_prefix = uuid.uuid4().hex[:16] + "-"  # reservation ids: unique across replicas, cheap
        self._ids = itertools.count()
        self.backend_errors = 0
        self._plans: BoundedDict[tuple[str, str], Known] = BoundedDict(PLANS_CACHED)

    def _known(self, team: str, key_id: str) -> Known | None:
        """The caller's plan without an await: its rows are cached and the plan was worked out from them."""
        known = self._plans.get((team, key_id))
        book = self.book
        if known is not None and known.until > book.clock() and known.generation == book.generation:
            return known
        return None

    def _known_plan(self, team: str, key_id: str) -> Plan | None:
        known = self._known(team, key_id)
        return known.plan if known is not None else None

    async def plan(self, team: str, key_id: str) -> Plan:
        """The caller's limits, worked out again only when the book hands out other rows."""
        book = self.book
        rows = (await book.get("team", team), await book.get("key", key_id))
        # from here nothing awaits: the rows are the book's now, or were forgotten while they were read
        until = min(book.until("team", team, rows[0]), book.until("key", key_id, rows[1]))
        known = self._plans.get((team, key_id))
        if known is not None and known.rows[0] is rows[0] and known.rows[1] is rows[1]:
            # the same rows as last time (the book hands out a row until it expires)
            known.until, known.generation = until, book.generation
            return known.plan
        subjects = []
        for scope, name, row in (("team", team, rows[0]), ("key", key_id, rows[1])):
            if row is None or row.budget_picousd is None:
                self.budgets.unbudgeted(scope, name)
            if row is not None and not row.empty:
                subjects.append(Subject(scope, name, row))
        plan = Plan.of(subjects, self.currency)
        self._plans[(team, key_id)] = Known(rows, plan, until, book.generation)
        return plan

    async def limited(self, team: str, key_id: str) -> bool:
        """Whether a limit applies to the caller (True when its limits cannot be read)."""
        known = self._known(team, key_id)
        if known is not None:
            return bool(known.plan.subjects)
        try:
            return bool((await self.plan(team, key_id)).subjects)
        except BACKEND_ERRORS:
            return True

    async def count_refused(self, team: str, key_id: str) -> Refusal | None:
        """A request refused for what it is (a 400) is still one of its caller's requests per minute
        (issue 48: refused ones were free, and each was stored): its refusal once they are spent. Only the
        rates are asked; it reserves no tokens and no budget, and leaves nothing in flight."""
        known = self._known(team, key_id)
        try:
            plan = known.plan if known is not None else await self.plan(team, key_id)
            if not plan.rated:
                return None
            now = self.clock()
            ask = Ask(f"{self._ids_prefix}{next(self._ids)}", now, 0, 0, now + self.hold_seconds)
            refused, info = await self.rates.acquire(plan.rated, ask, now)
            if refused is not None:
                return dataclasses.replace(refused, info=info)
            await self.rates.release(plan.rated, ask, 0)
        except BACKEND_ERRORS:  # the 400 is answered all the same
            self.backend_errors += 1
        return None

    async def admit(self, team: str, key_id: str, bounds: Callable[[float], tuple[int, int]],
                    started_at: float | None = None, priced: bool = True) -> Admission | Refusal | None:
        """None: no limit applies. `bounds(t)` (asked only when a limit applies) is the request's upper bound
        of tokens and the cost of those tokens at time t (peak or off-peak), in picoUSD. t is `started_at`
        (when the request started: its usage record is priced at that time and counted in the budget
        period that time falls in, so its reservation is too), else now. `priced` False: the model has no
        price and limits.unpriced is "refuse": refused where a budget applies."""
        known = self._known(team, key_id)
        if known is not None:
            plan = known.plan
        else:
            try:
                plan = await self.plan(team, key_id)
            except BACKEND_ERRORS as exc:
                return self._backend_down(exc)
        if not plan.subjects:
            return None
        if plan.budgeted and (not priced or plan.foreign is not None):
            return self._unbudgetable(plan, priced)
        now = self.clock()
        at = now if started_at is None else started_at
        tokens, cost = bounds(at)
        ask = Ask(f"{self._ids_prefix}{next(self._ids)}", at, tokens, cost, now + self.hold_seconds)
        if plan.rated and self.per_process_rates:
            self.per_process_rates = False
            log.warning("server.workers = %d without limits.redis_url: rpm, tpm and max_concurrent are "
                        "counted by each worker process on its own; set limits.redis_url to share them",
                        self.settings.server.workers)
        admission = Admission(ask, plan.subjects, [], [])
        try:
            if plan.rated:
                rates = self.rates
                if isinstance(rates, LocalRates):  # no I/O: no coroutine either
                    refused, admission.info = rates.acquire_now(plan.rated, ask, now)
                else:
                    refused, admission.info = await rates.acquire(plan.rated, ask, now)
                if refused is not None:
                    return dataclasses.replace(refused, info=admission.info)
                admission.rated = plan.rated
            if plan.budgeted:
                holds = [self._hold(s, ask) for s in plan.budgeted]
                over = await self.budgets.reserve(holds, now)
                if over is not None:
                    await self._release_rates(admission, 0, cancel=True)
                    refusal = await self._over_budget(over, plan.subjects, now)
                    return dataclasses.replace(refusal, info=admission.info)
                admission.holds = holds
        except BACKEND_ERRORS as exc:
            await self._release_rates(admission, 0, cancel=True)
            return self._backend_down(exc)
        return admission

    def settle_now(self, admission: Admission, tokens: int, cost: int) -> None:
        """`settle` without a task, when the counters are `in_process` (the common single-replica case).
        `tokens`: prompt + completion tokens used; `cost` in picoUSD."""
        assert isinstance(self.rates, LocalRates)
        if admission.settled:
            return
        admission.settled = True
        self._settle_budgets(admission, cost)
        if admission.rated:
            rated, admission.rated = admission.rated, []
            self.rates.release_now(rated, admission.ask, tokens)

    def _settle_budgets(self, admission: Admission, cost: int) -> None:
        """Replace the budget holds by what the request cost (no I/O), and alert where a threshold is met."""
        if not admission.holds:
            return
        settled = self.budgets.settle_now(admission.holds, cost)
        if self.alerts.settings.webhook_url is None:
            return
        for hold, spent in settled:
            subject = next(s for s in admission.subjects if s.scope == hold.scope)
            self.alerts.check(hold.scope, hold.subject, subject.limits.budget_period or "month",
                              hold.period_start, spent, hold.budget_picousd)

    async def settle(self, admission: Admission, tokens: int, cost: int) -> None:
        if admission.settled:
            return
        admission.settled = True
        self._settle_budgets(admission, cost)  # first: no I/O, so a Redis error cannot leave a hold behind
        try:
            await self._release_rates(admission, tokens)
        except BACKEND_ERRORS as exc:
            self.backend_errors += 1
            log.warning("could not settle a request's quotas (%s); its reservations expire on their own", exc)

    async def status(self, scope: str, name: str) -> dict[str, Any]:
        """A team's or key's limits and, if it has a budget, the current period's spend and what is left
        (for the admin API, the CLI and the dashboard)."""
        row = await asyncio.to_thread(self.store.get_limits, scope, name) if self.store is not None else None
        limits = row or LimitRow(scope, name)
        cur = limits.budget_currency.lower() if limits.budget_picousd is not None else self.currency.lower()
        out: dict[str, Any] = {
            f"budget_{cur}": None if limits.budget_picousd is None else limits.budget_picousd / 1e12,
            "budget_period": limits.budget_period if limits.budget_picousd is not None else None,
            "rpm": limits.rpm, "tpm": limits.tpm, "max_concurrent": limits.max_concurrent,
            "currency": cur.upper()}
        if limits.budget_picousd is None or self.store is None:  # the calendar month's spend, for reference
            start = period_start(self.clock(), "month")
            spent = 0 if self.store is None else await asyncio.to_thread(self.store.spend, scope, name, start,
                                                                         cur.upper())
            out.update({"period_start": start, f"spent_{cur}": spent / 1e12, f"held_{cur}": 0.0,
                        f"remaining_{cur}": None})
            return out
        period = limits.budget_period or "month"
        start = period_start(self.clock(), period)
        spent, held = await self.budgets.state(scope, name, start, self.clock())
        out.update({"budget_period": period, "period_start": start,
                    "period_end": period_end(start + 1, period),
                    f"spent_{cur}": spent / 1e12, f"held_{cur}": held / 1e12,
                    f"remaining_{cur}": max(limits.budget_picousd - spent - held, 0) / 1e12,
                    "used_percent": round(100 * spent / limits.budget_picousd, 2) if limits.budget_picousd
                    else None})
        return out

    def budget_gauges(self) -> list[BudgetGauge]:
        """Every budget this process knows (a team or key with a budget that called it: the limit book's
        rows) and its current period's spend and holds as the budgets keep them, with no I/O: read when
        /metrics is scraped. Spent and held are None until a request of the current period was admitted
        or refused here."""
        now = self.clock()
        out = []
        for row in self.book.budgeted():
            assert row.budget_picousd is not None
            period = row.budget_period or "month"
            seen = self.budgets.seen(row.scope, row.subject, period_start(now, period))
            out.append(BudgetGauge(row.scope, row.subject, period, row.budget_currency, row.budget_picousd,
                                   *(seen if seen is not None else (None, None))))
        return out

    def forget(self, scope: str, name: str) -> None:
        """Limits changed by this process apply to it at once (other replicas: within cache_seconds)."""
        self.book.forget(scope, name)

    async def _release_rates(self, admission: Admission, used: int, cancel: bool = False) -> None:
        if admission.rated:
            rated, admission.rated = admission.rated, []
            try:
                await self.rates.release(rated, admission.ask, used, cancel)
            except BACKEND_ERRORS:
                if not cancel:
                    raise

    def _hold(self, subject: Subject, ask: Ask) -> Hold:
        """`ask`'s hold against `subject`'s budget for the period `ask` falls in."""
        budget = subject.limits.budget_picousd
        assert budget is not None
        start = period_start(ask.ts, subject.limits.budget_period or "month")
        return Hold(f"{ask.request_id}:{subject.scope}", subject.scope, subject.name, start, budget,
                    ask.cost_picousd, ask.expires_at)

    async def _over_budget(self, hold: Hold, subjects: list[Subject], now: float) -> Refusal:
        subject = next(s for s in subjects if s.scope == hold.scope)
        period = subject.limits.budget_period or "month"
        # refused because this request might not fit: the message (and the alert) say what is really spent
        spent, held = await self.budgets.state(hold.scope, hold.subject, hold.period_start, now)
        if self.alerts.due("hard", hold.scope, hold.subject, hold.period_start):
            self.alerts.fire("hard", hold.scope, hold.subject, period, hold.period_start, spent,
                             hold.budget_picousd)
        end = period_end(hold.period_start + 1, period)
        renews = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end)) if end is not None else ""
        until = f" It renews at {renews}." if renews else ""
        budget = hold.budget_picousd
        left = max(budget - spent - held, 0)
        used = f"{100 * spent / budget:.1f}% used" if budget else "none allowed"
        in_flight = f", {self.money(held)} held by requests in flight" if held else ""
        state = "is used up" if left == 0 else f"has {self.money(left)} left"
        return Refusal("budget", subject, budget, None,
                       f"The {period} budget of {subject.label} ({self.money(budget)}) {state}: spent "
                       f"{self.money(spent)} ({used}){in_flight}. This request would reserve up to "
                       f"{self.money(hold.amount_picousd)} (its upper bound, settled to what it uses), more "
                       f"than is left.{until}")

    def money(self, pico: int) -> str:
        """An amount of the prices' currency, as a refusal's message shows it."""
        return money_text(pico, self.symbol)

    def _unbudgetable(self, plan: Plan, priced: bool) -> Refusal:
        """A budget that cannot be kept: the model has no price (limits.unpriced = "refuse"), or the budget is
        in another currency than the prices (pricing.currency)."""
        if not priced:
            subject = plan.budgeted[0]
            return Refusal("unpriced", subject, 0, None,
                           f"chatgate has no {self.currency} price for this model, so the budget of "
                           f"{subject.label} cannot be kept (limits.unpriced = \"refuse\"). Use a priced "
                           "model, or ask the administrator to set its price.")
        foreign = plan.foreign
        assert foreign is not None
        return Refusal("budget", foreign, 0, None,
                       f"The budget of {foreign.label} is set in {foreign.limits.budget_currency} but "
                       f"chatgate prices in {self.currency} (pricing.currency): it cannot be kept. The "
                       f"administrator sets it again in {self.currency}.")

    def _backend_down(self, exc: BaseException) -> Refusal | None:
        self.backend_errors += 1
        log.warning("limits backend unavailable (%s: %s); %s", type(exc).__name__, exc,
                    "admitting the request (limits.on_backend_error = fail_open)" if self.fail_open
                    else "refusing the request (limits.on_backend_error = fail_closed)")
        if self.fail_open:
            return None
        return Refusal("unavailable", None, 0, 5.0, "chatgate cannot check this caller's limits right now "
                       "(Redis or the store is unreachable) and is set to refuse then (fail_closed).")

    async def close(self) -> None:
        try:
            await self.budgets.close()
        except BACKEND_ERRORS as exc:
            log.warning("could not give this replica's budget leases back (%s); they expire on their own",
                        exc)
        await self.alerts.drain()
        await self.rates.close()


def money_text(pico: int, symbol: str = "$") -> str:
    """An amount in pico-units of a currency with two decimals, and with the digits an amount below one unit
    needs to show four significant ones ($0.0001, not $0.00)."""
    value = Decimal(pico) / PICO_PER_USD
    places = 2 if value == 0 or abs(value) >= 1 else min(max(2, 3 - value.adjusted()), 12)
    text = f"{value:.{places}f}"
    if places > 2:
        whole, _, decimals = text.partition(".")
        text = f"{whole}.{decimals.rstrip('0').ljust(2, '0')}"
    return f"{symbol}{text}"


def refusal_error(refusal: Refusal) -> APIError:
    """The 429 (or 503 when the limits cannot be checked) in the OpenAI shape the SDKs understand: a budget
    refusal says `insufficient_quota` and tells the SDKs not to retry; a rate refusal carries Retry-After."""
    if refusal.kind == "unavailable":
        return APIError(503, refusal.message, "server_error", None, "limits_unavailable",
                        headers={"retry-after": "5"})
    if refusal.kind == "unpriced":
        return APIError(400, refusal.message, "invalid_request_error", "model", "unpriced_model",
                        headers={"x-should-retry": "false"})
    if refusal.kind == "budget":
        return APIError(429, refusal.message, "insufficient_quota", None, "insufficient_quota",
                        headers={"x-should-retry": "false"})
    if refusal.retry_after is None:  # waiting cannot help: the SDKs must not retry
        headers = {"x-should-retry": "false"}
    else:
        headers = {"retry-after": str(max(1, math.ceil(refusal.retry_after)))}
    kind = "tokens" if refusal.kind == "tpm" else "requests"  # OpenAI's error types for rate limits
    return APIError(429, refusal.message, kind, None, "rate_limit_exceeded", headers=headers)
