"""Budgets in the shared store taken a lease at a time (chatgate/quotas/budgets.py StoreBudgets): admissions
inside a lease ask nothing of the store, spend reaches the ledger within FLUSH_DELAY, idle leases go back,
and two replicas together never hold more than the budget."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chatgate.quotas import budgets as budgets_module
from chatgate.quotas.budgets import LEASE_ASKS, StoreBudgets
from chatgate.store.base import Hold, LeaseAsk, LeaseGrant, StoreError
from chatgate.store.postgres import PostgresStore
from chatgate.store.sqlite import SQLiteStore
from tests.pgutil import fresh_database

BUDGET = 1000
T0 = 0.0


class CountingStore(SQLiteStore):
    """A SQLite store that counts the lease renewals it is asked for."""

    renewals = 0

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        self.renewals += 1
        return super().renew_leases(asks, now)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = SQLiteStore(tmp_path / "b.db")
    store.migrate()
    store.close()
    return tmp_path / "b.db"


@pytest.fixture
def store(db: Path) -> Iterator[CountingStore]:
    s = CountingStore(db)
    yield s
    s.close()


def hold(n: int, amount: int = 10, budget: int = BUDGET, scope: str = "team", subject: str = "red") -> Hold:
    return Hold(f"r{n}:{scope}", scope, subject, T0, budget, amount, 10**12)


def test_admissions_inside_a_lease_ask_nothing_of_the_store(store: CountingStore) -> None:
    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        budget = 10**9  # far from its end: the lease is what 1 + LEASE_ASKS requests reserve
        for n in range(1 + LEASE_ASKS):
            assert await budgets.reserve([hold(n, budget=budget)], 1.0) is None
        assert store.renewals == 1
        assert store.budget_state("team", "red", T0, 1.0) == (0, 10 * (1 + LEASE_ASKS))
        assert await budgets.reserve([hold(99, budget=budget)], 1.0) is None
        assert store.renewals == 2, "the lease was full: renewed"
        await budgets.close()

    asyncio.run(go())


def test_settled_spend_reaches_the_ledger_and_an_idle_lease_goes_back(
        store: CountingStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budgets_module, "IDLE_SECONDS", 0.3)

    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)  # the real clock: idleness is measured with it
        assert await budgets.reserve([hold(1, 50)], time.time()) is None
        assert budgets.settle_now([hold(1, 50)], 20) == [(hold(1, 50), 20)]
        await asyncio.sleep(budgets_module.FLUSH_DELAY + 0.1)
        spent, held = store.budget_state("team", "red", T0, time.time())
        lease = 50 + (1000 - 50) // 4  # the request + a quarter of what was free (not 32 requests' worth)
        assert spent == 20 and held == lease - 20, "flushed: the spend moved from the lease to the ledger"
        for _ in range(40):
            await asyncio.sleep(0.1)
            if not budgets.leases:
                break
        assert not budgets.leases and store.budget_state("team", "red", T0, time.time()) == (20, 0)

    asyncio.run(go())


def test_a_lowered_budget_applies_at_the_next_admission(store: CountingStore) -> None:
    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        assert await budgets.reserve([hold(1, 100)], 1.0) is None
        budgets.settle_now([hold(1, 100)], 100)
        refused = hold(2, 100, budget=150)
        assert await budgets.reserve([refused], 1.0) == refused, "100 spent + 100 > 150"
        assert await budgets.reserve([hold(3, 50, budget=150)], 1.0) is None
        budgets.settle_now([hold(3, 50, budget=150)], 30)
        await budgets.close()
        assert store.budget_state("team", "red", T0, 1.0) == (130, 0), "closing flushed, gave the lease back"

    asyncio.run(go())


def test_team_and_key_are_all_or_nothing(store: CountingStore) -> None:
    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        key_over = hold(1, 300, budget=200, scope="key", subject="k1")
        assert await budgets.reserve([hold(1, 300), key_over], 1.0) == key_over
        await budgets.close()
        assert store.budget_state("team", "red", T0, 1.0) == (0, 0)

    asyncio.run(go())


def test_two_replicas_with_concurrent_requests_never_hold_more_than_the_budget(db: Path) -> None:
    """Two replicas (two stores on one file), 300 requests at once, each reserving 10 and spending all of it
    (the worst case) after a random pause: the spend is at most the budget, and close to it."""
    stores = [SQLiteStore(db), SQLiteStore(db)]

    async def go() -> int:
        replicas = [StoreBudgets(s, 60.0) for s in stores]
        admitted = 0

        async def one(n: int) -> None:
            nonlocal admitted
            budgets = replicas[n % 2]
            h = hold(n)
            if await budgets.reserve([h], 1.0) is None:
                admitted += 1
                await asyncio.sleep(random.random() * 0.05)
                budgets.settle_now([h], 10)

        await asyncio.gather(*(one(n) for n in range(300)))
        for budgets in replicas:
            await budgets.close()
        return admitted

    try:
        admitted = asyncio.run(go())
        spent, held = stores[0].budget_state("team", "red", T0, 1.0)
    finally:
        for s in stores:
            s.close()
    assert held == 0 and spent == 10 * admitted
    assert BUDGET - 10 * 2 * 2 <= spent <= BUDGET, "never over; at most a request or two per replica unused"


class SlowFlushStore(CountingStore):
    """Flushes (need == keep) take 0.5 s, as on a loaded database."""

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        if all(a.need_picousd == a.keep_picousd for a in asks):
            time.sleep(0.5)
        return super().renew_leases(asks, now)


def test_admissions_do_not_wait_for_a_flush(db: Path) -> None:
    store = SlowFlushStore(db)

    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        assert await budgets.reserve([hold(1)], time.time()) is None
        budgets.settle_now([hold(1)], 10)
        await asyncio.sleep(budgets_module.FLUSH_DELAY + 0.1)  # the flush is under way
        lease = next(iter(budgets.leases.values()))
        assert lease.lock.locked()
        started = time.monotonic()
        assert await budgets.reserve([hold(2)], time.time()) is None
        assert time.monotonic() - started < 0.2, "admitted inside the lease while it was being flushed"
        budgets.settle_now([hold(2)], 10)
        await budgets.close()

    try:
        asyncio.run(go())
        assert store.budget_state("team", "red", T0, time.time()) == (20, 0)
    finally:
        store.close()


class SlowRenewalStore(CountingStore):
    """Renewals that ask for more room (need > keep) take 0.3 s."""

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        if any(a.need_picousd > a.keep_picousd for a in asks):
            time.sleep(0.3)
        return super().renew_leases(asks, now)


def test_a_request_cancelled_during_a_renewal_takes_nothing_and_spend_is_flushed_once(db: Path) -> None:
    store = SlowRenewalStore(db)

    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        assert await budgets.reserve([hold(1, 900)], time.time()) is None
        budgets.settle_now([hold(1, 900)], 10)  # 10 spent, not flushed yet; the lease is nearly full
        request = asyncio.ensure_future(budgets.reserve([hold(2, 950)], time.time()))  # renews
        await asyncio.sleep(0.1)
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        await asyncio.sleep(0.4)  # the renewal finished on its own
        lease = next(iter(budgets.leases.values()))
        assert lease.holds == {} and lease.spent == 0, "nothing taken; the spend went with the renewal"
        await budgets.close()

    try:
        asyncio.run(go())
        assert store.budget_state("team", "red", T0, time.time()) == (10, 0)
    finally:
        store.close()


def test_a_request_waiting_while_its_lease_is_given_back_still_has_its_cost_flushed(db: Path) -> None:
    """The idle flush gives a lease back while a request that does not fit in it waits for its lock: the
    request must take a live lease, or its settled cost would never reach the ledger (the spend undercounted,
    and the budget overspent by the next requests: the two-replica flake of earlier stops)."""
    store = SlowFlushStore(db)

    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        assert await budgets.reserve([hold(1)], time.time()) is None
        budgets.settle_now([hold(1)], 10)
        flush = asyncio.ensure_future(budgets.flush(idle_after=0.0))  # gives the idle lease back (0.5 s)
        await asyncio.sleep(0.1)
        (lease,) = budgets.leases.values()
        assert lease.lock.locked() and lease.shrinking
        request = asyncio.ensure_future(budgets.reserve([hold(2, 300)], time.time()))  # waits for the lock
        await flush
        assert await request is None
        (live,) = budgets.leases.values()
        assert hold(2, 300).hold_id in live.holds, "the hold is in the lease the flushes see"
        assert budgets.settle_now([hold(2, 300)], 40) != []
        await budgets.close()

    try:
        asyncio.run(go())
        assert store.budget_state("team", "red", T0, time.time()) == (50, 0), "both costs in the ledger"
    finally:
        store.close()


class LostAnswerStore:
    """Wraps a store: the first flush it is asked for is applied (committed) and then fails as if the
    connection had been cut before its answer arrived, the case of a watchdog cut or a network drop just
    after the COMMIT."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lost = 0

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        answer = self.inner.renew_leases(asks, now)
        if not self.lost and all(a.need_picousd == a.keep_picousd for a in asks):
            self.lost += 1
            raise StoreError("connection cut after the commit (simulated)")
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        store: Any = SQLiteStore(tmp_path / "b.db")
        store.migrate()
        yield store
        store.close()
        return
    with fresh_database() as url:
        store = PostgresStore(url)
        store.migrate()
        yield store
        store.close()


def test_a_flush_whose_answer_was_lost_is_not_counted_twice(any_store: Any) -> None:
    """The store applied a flush but its answer never came: the replica tries again with what it has
    settled since, and the ledger counts each cost once (the spend is not double counted, nor lost)."""
    store = LostAnswerStore(any_store)

    async def go() -> None:
        budgets = StoreBudgets(store, 60.0)
        assert await budgets.reserve([hold(1, 100)], time.time()) is None
        budgets.settle_now([hold(1, 100)], 30)
        await budgets.flush()  # applied, answer lost: the replica must assume nothing
        assert store.lost == 1 and budgets.flush_errors == 1
        assert await budgets.reserve([hold(2, 100)], time.time()) is None
        budgets.settle_now([hold(2, 100)], 12)
        await budgets.flush()
        assert any_store.budget_state("team", "red", T0, time.time())[0] == 42
        await budgets.close()

    asyncio.run(go())
    assert any_store.budget_state("team", "red", T0, time.time()) == (42, 0), "each cost once, no hold left"
