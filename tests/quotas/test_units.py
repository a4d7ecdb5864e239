"""Quotas without HTTP: calendar periods, the in-process rate window, budgets all or nothing, the 429s."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chatgate.quotas.budgets import LocalBudgets
from chatgate.quotas.gate import Quotas, refusal_error
from chatgate.quotas.model import WINDOW, Admission, Ask, Refusal, Subject, duration
from chatgate.quotas.periods import period_end, period_start
from chatgate.quotas.rates import LocalRates, Window
from chatgate.quotas.redis_rates import RedisRates
from chatgate.settings import Settings
from chatgate.store.base import Hold, LimitRow
from chatgate.store.sqlite import SQLiteStore
from tests.quotas.support import RedisServer

USD = 10**12


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(("at", "period", "start", "end"), [
    ("2026-11-30T17:46:00", "day", "2026-11-30T00:00:00", "2026-12-01T00:00:00"),
    ("2026-11-30T17:46:00", "week", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),  # a Monday
    ("2026-12-06T23:59:59", "week", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),
    ("2026-11-30T17:46:00", "month", "2026-11-01T00:00:00", "2026-12-01T00:00:00"),
    ("2026-12-31T23:59:59", "month", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
    ("2024-02-29T12:00:00", "month", "2024-02-01T00:00:00", "2024-03-01T00:00:00"),
])
def test_calendar_periods_in_utc(at: str, period: str, start: str, end: str) -> None:
    assert period_start(ts(at), period) == ts(start)
    assert period_end(ts(at), period) == ts(end)


def test_the_total_period_never_ends() -> None:
    assert period_start(ts("2026-11-30T00:00:00"), "total") == 0.0 and period_end(1.0, "total") is None


def test_reset_durations_in_openais_style() -> None:
    assert [duration(x) for x in (0.02, 1.5, 59.0, 360.0, -1.0)] == ["20ms", "1.5s", "59s", "6m0s", "0ms"]


def subject(scope: str = "team", name: str = "search", **limits: int) -> Subject:
    return Subject(scope, name, LimitRow(scope, name, **limits))  # type: ignore[arg-type]


def ask(n: int, tokens: int = 100, at: float = 1000.0) -> Ask:
    return Ask(f"r{n}", at, tokens, 0, at + 600)


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


RatesFactory = Callable[[], Any]


@pytest.fixture(params=["local", "redis"])
def make_rates(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RatesFactory]:
    """The in-process counters, and the Redis ones (Lua scripts) on a redis-server of the test's own: the
    same tests hold for both."""
    if request.param == "local":
        yield LocalRates
        return
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield lambda: RedisRates(server.url, prefix="t-" + secrets.token_hex(4))
    finally:
        server.stop()


def check(make_rates: RatesFactory, body: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        rates = make_rates()
        try:
            await body(rates)
        finally:
            if isinstance(rates, RedisRates):
                await rates.close()

    asyncio.run(main())


def test_rpm_is_a_sliding_minute_and_all_or_nothing(make_rates: RatesFactory) -> None:
    team, key = subject(rpm=3), subject("key", "fp-1", rpm=2)

    async def body(rates: Any) -> None:
        for n in range(2):
            refused, info = await rates.acquire([team, key], ask(n), 1000.0 + n)
            assert refused is None
        assert (info.limit_requests, info.remaining_requests) == (2, 0)  # the tighter of the two
        refused, _ = await rates.acquire([team, key], ask(2), 1010.0)
        assert refused.kind == "rpm" and refused.subject == key and refused.retry_after == pytest.approx(50.0)
        refused, _ = await rates.acquire([team], ask(3), 1010.0)
        assert refused is None, "the key's refusal did not count against the team"
        refused, _ = await rates.acquire([team, key], ask(4), 1000.0 + WINDOW + 0.5)
        assert refused is None, "a minute later the first requests have left the window"

    check(make_rates, body)


def test_tpm_reserves_then_settles_to_the_actual_tokens(make_rates: RatesFactory) -> None:
    team = subject(tpm=1000)

    async def body(rates: Any) -> None:
        assert (await rates.acquire([team], ask(1, 600), 1000.0))[0] is None
        refused = (await rates.acquire([team], ask(2, 600), 1001.0))[0]
        assert refused.kind == "tpm" and refused.retry_after == pytest.approx(59.0)
        await rates.release([team], ask(1, 600), 150)
        third = await rates.acquire([team], ask(3, 600), 1002.0)
        assert third[0] is None, "150 + 600 fit"
        assert third[1].remaining_tokens == 1000 - 150 - 600
        too_big = (await rates.acquire([team], ask(4, 5000), 1003.0))[0]
        assert too_big.retry_after is None and "can never fit" in too_big.message
        # a minute on, both entries have left the window: the whole minute is free again
        fresh = await rates.acquire([team], ask(5, 1000), 1003.0 + WINDOW)
        assert fresh[0] is None and fresh[1].remaining_tokens == 0

    check(make_rates, body)


@pytest.mark.slow
def test_a_window_that_expires_20000_entries_at_once_is_pruned(make_rates: RatesFactory) -> None:
    """A subject busy for a minute, then idle: its next request finds every entry expired at once (Redis's
    Lua `unpack` stops at about 8,000 values, so the script prunes in batches)."""
    team = subject(rpm=10**7, tpm=10**12)

    async def body(rates: Any) -> None:
        for n in range(20_000):
            assert (await rates.acquire([team], ask(n, 10), 1000.0 + n / 1000))[0] is None
        refused, info = await rates.acquire([team], ask(99_999, 10), 1000.0 + 20 + WINDOW)
        assert refused is None
        assert info.remaining_requests == 10**7 - 1 and info.remaining_tokens == 10**12 - 10

    check(make_rates, body)


def test_a_cancelled_request_leaves_no_trace(make_rates: RatesFactory) -> None:
    team = subject(rpm=1, tpm=500)

    async def body(rates: Any) -> None:
        assert (await rates.acquire([team], ask(1, 400), 1000.0))[0] is None
        await rates.release([team], ask(1, 400), 0, True)  # refused by a budget after all: never sent
        again = await rates.acquire([team], ask(2, 500), 1001.0)
        assert again[0] is None and again[1].remaining_requests == 0 and again[1].remaining_tokens == 0

    check(make_rates, body)


def test_concurrency_counts_requests_in_flight(make_rates: RatesFactory) -> None:
    key = subject("key", "fp-1", max_concurrent=2)

    async def body(rates: Any) -> None:
        assert (await rates.acquire([key], ask(1), 1.0))[0] is None
        assert (await rates.acquire([key], ask(2), 1.0))[0] is None
        assert (await rates.acquire([key], ask(3), 1.0))[0].kind == "concurrency"
        await rates.release([key], ask(1), 10)
        assert (await rates.acquire([key], ask(4), 1.0))[0] is None

    check(make_rates, body)


def test_the_local_window_keeps_its_entries_across_growth_settles_and_cancels() -> None:
    """The in-process window is a ring of doubles that doubles when full: positions handed out before a
    growth still settle and cancel the right entry, and a cancelled one in the middle stops counting."""
    window = Window()
    positions = [window.add(1000.0 + n, 10.0) for n in range(200)]  # grows 64 -> 128 -> 256
    window.settle(positions[3], 4.0)
    window.cancel(positions[150])
    assert window.requests == 199 and window.tokens == 200 * 10 - 6 - 10
    assert window.entries()[3] == (1003.0, 4.0) and (1150.0, 10.0) not in window.entries()
    window.prune(1000.0 + 150 + WINDOW)  # 0..150 have left, the cancelled one among them
    assert window.requests == 49 and window.gone == 0 and window.oldest() == 1151.0
    assert window.tokens == 49 * 10
    window.settle(positions[3], 500.0)  # long gone: settling it changes nothing
    window.cancel(positions[10])
    assert window.requests == 49 and window.tokens == 49 * 10


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "q.db")
    s.migrate()
    yield s
    s.close()


def hold(n: int, amount: int, budget: int = 10 * USD, scope: str = "team", subject_: str = "search") -> Hold:
    return Hold(f"h{n}", scope, subject_, 0.0, budget, amount, 10**12)


def test_local_budgets_start_from_recorded_spend_and_are_all_or_nothing(store: SQLiteStore) -> None:
    from tests.store.test_store_contract import record

    store.insert_usage([record("old", team="search", cost_picousd=4 * USD, ts=1.0)])
    budgets = LocalBudgets(store)
    assert run(budgets.reserve([hold(1, 5 * USD)], 2.0)) is None
    over = hold(2, 2 * USD)
    assert run(budgets.reserve([hold(3, 1, scope="key", subject_="k"), over], 2.0)) == over
    assert run(budgets.state("key", "k", 0.0, 2.0)) == (0, 0)
    assert budgets.settle_now([hold(1, 5 * USD)], 3 * USD) == [(hold(1, 5 * USD), 7 * USD)]
    assert run(budgets.state("team", "search", 0.0, 2.0)) == (7 * USD, 0)


def test_the_gate_refuses_in_order_and_releases_what_it_took(store: SQLiteStore) -> None:
    store.set_limits(LimitRow("team", "search", budget_picousd=USD, budget_period="day", rpm=10))
    store.set_limits(LimitRow("key", "fp-1", max_concurrent=5))
    quotas = Quotas(Settings(), store, clock=lambda: ts("2026-11-30T12:00:00"))

    async def go() -> list[Admission | Refusal | None]:
        out = [await quotas.admit("search", "fp-1", lambda _: (100, USD // 2)) for _ in range(3)]
        out.append(await quotas.admit("other", "fp-9", lambda _: (100, 10 * USD)))
        return out

    first, second, third, free = run(go())  # type: ignore[misc]
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert isinstance(third, Refusal) and third.kind == "budget" and third.code == "budget:team"
    assert free is None, "a caller without limits is not admitted at all: nothing to settle"
    error = refusal_error(third)
    assert (error.status, error.code, error.headers["x-should-retry"]) == (429, "insufficient_quota", "false")
    window = quotas.rates.windows[("team", "search")]  # type: ignore[union-attr]
    assert window.requests == 2, "the refused request's rate slot was given back"
    assert len(quotas.rates.windows[("key", "fp-1")].in_flight) == 2  # type: ignore[union-attr]


def test_a_callers_plan_is_known_without_the_book_until_a_row_expires_or_is_forgotten(
        store: SQLiteStore) -> None:
    """Admission reads a caller's limits by one expiry check (no look-up in the book) while both its rows
    are the book's, and works them out again when one expires, is forgotten or the book is emptied."""
    store.set_limits(LimitRow("key", "fp-1", rpm=10))
    quotas = Quotas(Settings(), store)
    now = [100.0]
    quotas.book.clock = lambda: now[0]
    ttl = quotas.book.ttl

    plan = run(quotas.plan("search", "fp-1"))
    assert [s.limits.rpm for s in plan.subjects] == [10]
    assert quotas._known_plan("search", "fp-1") is plan
    now[0] += ttl - 0.01
    assert quotas._known_plan("search", "fp-1") is plan
    now[0] += 0.02  # a row expired: the book must look again
    assert quotas._known_plan("search", "fp-1") is None
    store.set_limits(LimitRow("key", "fp-1", rpm=20))
    changed = run(quotas.plan("search", "fp-1"))
    assert [s.limits.rpm for s in changed.subjects] == [20]
    assert quotas._known_plan("search", "fp-1") is changed

    store.set_limits(LimitRow("key", "fp-1", rpm=30))
    quotas.forget("key", "fp-1")  # a change made through this process applies at once
    assert quotas._known_plan("search", "fp-1") is None
    assert [s.limits.rpm for s in run(quotas.plan("search", "fp-1")).subjects] == [30]
    assert quotas._known_plan("search", "fp-1") is not None
    quotas.book.forget("team", "other")  # any forget: the plans worked out before it are checked again
    assert quotas._known_plan("search", "fp-1") is None


def test_a_reservation_is_priced_at_the_request_start(store: SQLiteStore) -> None:
    """The request started in the last millisecond of the off-peak hours and was admitted in the peak
    hours: its reservation is priced as its usage record will be, at its start."""
    store.set_limits(LimitRow("team", "search", budget_picousd=USD, budget_period="day"))
    quotas = Quotas(Settings(), store, clock=lambda: ts("2026-11-30T01:00:00") + 0.002)
    started = ts("2026-11-30T01:00:00") - 0.001
    asked: list[float] = []

    def bounds(at: float) -> tuple[int, int]:
        asked.append(at)
        return 100, USD // 4

    assert isinstance(run(quotas.admit("search", "fp-1", bounds, started_at=started)), Admission)
    assert isinstance(run(quotas.admit("search", "fp-1", bounds)), Admission)
    assert asked == [started, ts("2026-11-30T01:00:00") + 0.002], "without a start: priced now"


def test_a_reservation_counts_in_the_budget_period_of_the_request_start(store: SQLiteStore) -> None:
    """The request started in the last millisecond of a day whose budget is spent and was admitted in the
    next: its usage record (its time is the start) counts in the spent day, so the reservation does too and
    it is refused; one that started after midnight is admitted against the new day."""
    from tests.store.test_store_contract import record

    midnight = ts("2026-11-30T00:00:00")
    store.set_limits(LimitRow("team", "search", budget_picousd=USD, budget_period="day"))
    store.insert_usage([record("spent", team="search", cost_picousd=USD, ts=midnight - 3600)])
    quotas = Quotas(Settings(), store, clock=lambda: midnight + 0.002)

    late = run(quotas.admit("search", "fp-1", lambda _: (100, USD // 4), started_at=midnight - 0.001))
    assert isinstance(late, Refusal) and late.code == "budget:team"
    fresh = run(quotas.admit("search", "fp-1", lambda _: (100, USD // 4), started_at=midnight + 0.001))
    assert isinstance(fresh, Admission)
    assert [h.period_start for h in fresh.holds] == [midnight]
    now = run(quotas.admit("search", "fp-1", lambda _: (100, USD // 4)))
    assert isinstance(now, Admission) and [h.period_start for h in now.holds] == [midnight]


def test_a_rate_refusal_is_a_429_with_retry_after() -> None:
    refusal = Refusal("rpm", subject(rpm=1), 1, 12.2, "slow down")
    error = refusal_error(refusal)
    assert (error.status, error.type, error.code, error.headers) == (429, "requests", "rate_limit_exceeded",
                                                                     {"retry-after": "13"})
    assert refusal_error(Refusal("unavailable", None, 0, 5.0, "down")).status == 503
