"""Budgets: a request is admitted only if, for each budget that applies, spent + held + its reservation
fits; when it ends its hold is replaced by what it cost.

`StoreBudgets` keeps the ledger in the shared store, atomic across replicas, and takes the budget a slice
at a time (a lease) so that most admissions need no round trip. `LocalBudgets` keeps it in this process
(one replica), each period's spend started from the usage the store already recorded for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from chatgate.bounded import BoundedDict
from chatgate.store.base import Hold, LeaseAsk, LeaseGrant, LimitStore

log = logging.getLogger("chatgate.quotas")


@dataclass(slots=True)
class BudgetLedger:
    spent: int
    holds: dict[str, int] = field(default_factory=dict)
    held: int = 0  # the sum of holds

    def hold(self, hold_id: str, amount: int) -> None:
        self.holds[hold_id] = amount
        self.held += amount


class LocalBudgets:
    def __init__(self, store: LimitStore | None) -> None:
        self.store = store
        # (scope, subject) -> period start -> its ledger
        self.ledgers: dict[tuple[str, str], dict[float, BudgetLedger]] = {}

    def known(self, scope: str, subject: str, period_start: float) -> BudgetLedger | None:
        periods = self.ledgers.get((scope, subject))
        return periods.get(period_start) if periods is not None else None

    async def _ledger(self, scope: str, subject: str, period_start: float) -> BudgetLedger:
        ledger = self.known(scope, subject, period_start)
        if ledger is None:
            spent = 0
            if self.store is not None:
                spent = await asyncio.to_thread(self.store.spend, scope, subject, period_start)
            # another request may have seeded it while this one waited
            ledgers = self.ledgers.setdefault((scope, subject), {})
            ledger = ledgers.setdefault(period_start, BudgetLedger(spent))
        return ledger

    def unbudgeted(self, scope: str, subject: str) -> None:
        """The subject has no budget (now): its spending is no longer tracked, so its ledgers go (those
        without requests in flight); a budget set again starts from the usage the store recorded."""
        periods = self.ledgers.get((scope, subject))
        if periods is None:
            return
        for start in [start for start, ledger in periods.items() if not ledger.holds]:
            del periods[start]
        if not periods:
            del self.ledgers[(scope, subject)]

    async def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        pairs = []  # (hold, its ledger); no zip(strict=True): its keyword is parsed on every call
        for h in holds:
            ledger = self.known(h.scope, h.subject, h.period_start)  # no await when known: the hot path
            pairs.append((h, ledger if ledger is not None else await self._ledger(h.scope, h.subject,
                                                                                  h.period_start)))
        # From here to the end nothing awaits: the check and the holds are one step for this event loop.
        for hold, ledger in pairs:
            if ledger.spent + ledger.held + hold.amount_picousd > hold.budget_picousd:
                return hold
        for hold, ledger in pairs:
            ledger.hold(hold.hold_id, hold.amount_picousd)
        return None

    def settle_now(self, holds: Sequence[Hold], amount: int) -> list[tuple[Hold, int]]:
        """(hold, the ledger's spend after it) for each hold."""
        out = []
        for hold in holds:
            ledger = self.known(hold.scope, hold.subject, hold.period_start)
            held = ledger.holds.pop(hold.hold_id, None) if ledger is not None else None
            if ledger is not None and held is not None:
                ledger.held -= held
                ledger.spent += amount
                out.append((hold, ledger.spent))
        return out

    async def state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        ledger = await self._ledger(scope, subject, period_start)
        return ledger.spent, ledger.held

    def seen(self, scope: str, subject: str, period_start: float) -> tuple[int, int] | None:
        """(spent, held) of the period as this process keeps it, with no I/O (for /metrics); None when no
        request of the period was admitted or refused here yet (its ledger is read from the store then)."""
        ledger = self.known(scope, subject, period_start)
        return (ledger.spent, ledger.held) if ledger is not None else None

    async def close(self) -> None:
        """Nothing is held outside this process."""


LEASE_ASKS = 32  # a lease asks room for this many more requests like the one that renews it
FLUSH_DELAY = 0.05  # seconds: spend settled under a lease reaches the store's ledger within about this
IDLE_SECONDS = 1.0  # a lease no request used for this long goes back to the budget
LAST_SPENT_KEPT = 10_000  # budgets whose last known spend is kept after their lease went back


@dataclass(slots=True)
class BudgetLease:
    """This replica's slice of one budget period: `granted` is held in the store under `hold_id`; requests
    in flight (`holds`) and what they spent since the last renewal (`spent`) always fit in it."""

    hold_id: str
    scope: str
    subject: str
    period_start: float
    budget: int = 0
    granted: int = 0
    expires_at: float = 0.0
    ledger_spent: int = 0  # the store's ledger at the last renewal, which included this lease's spend
    spent: int = 0
    flushed: int = 0  # what was settled under it and is in the ledger, as the store's answers say
    holds: dict[str, int] = field(default_factory=dict)
    used_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one store call per lease at a time
    shrinking: bool = False  # a call that may grant less than the lease has is under way

    @property
    def keep(self) -> int:
        return sum(self.holds.values())

    def fits(self, hold: Hold, now: float, hold_seconds: float) -> bool:
        return (not self.shrinking and self.budget == hold.budget_picousd
                and self.expires_at - now >= hold_seconds
                and self.keep + self.spent + hold.amount_picousd <= self.granted)


class StoreBudgets:
    """Budgets in the shared store, taken a slice (a lease) at a time.

    A request reserves its cost against this replica's lease without asking the store; when the lease is
    too small (or its budget changed, or it nears its expiry) one transaction renews it: the spend settled
    under it goes to the ledger and the lease becomes what is in flight + this request + room for
    `LEASE_ASKS` more, but never more than a quarter of what the budget has free, so near the end of a
    budget leases shrink to single requests and the store decides each one, as without leases. The store
    only grants what fits (spent + every hold + the lease <= budget), so the bound is the same as holding
    each request in the store: the spend exceeds the budget by at most what requests cost beyond their
    reservation. Settlements are local; their spend reaches the ledger within `FLUSH_DELAY`, a lease
    unused for `IDLE_SECONDS` is given back, and a replica that dies leaves its leases to expire.
    """

    def __init__(self, store: LimitStore, hold_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.hold_seconds = hold_seconds
        self.clock = clock
        self.leases: dict[tuple[str, str, float], BudgetLease] = {}
        self.prefix = f"lease:{uuid.uuid4().hex[:16]}:"
        self._count = itertools.count()
        self.flush_errors = 0
        # (scope, subject, period start) -> the ledger's spend when its lease was given back (for /metrics)
        self.last_spent: BoundedDict[tuple[str, str, float], int] = BoundedDict(LAST_SPENT_KEPT)
        self._keeper: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False

    def unbudgeted(self, scope: str, subject: str) -> None:
        """The store dropped the subject's ledger (a budget set again starts from the usage table, which has
        what was settled here): its leases forget their spend and go once idle."""
        for lease in self.leases.values():
            if (lease.scope, lease.subject) == (scope, subject):
                lease.flushed, lease.spent, lease.budget = lease.flushed + lease.spent, 0, -1
        for key in [key for key in self.last_spent if key[:2] == (scope, subject)]:
            del self.last_spent[key]

    def _lease(self, hold: Hold) -> BudgetLease:
        key = (hold.scope, hold.subject, hold.period_start)
        lease = self.leases.get(key)
        if lease is None:
            # a lease given back leaves its hold behind until it expires: the next one is another
            hold_id = f"{self.prefix}{next(self._count)}:{hold.scope}:{hold.subject}:{hold.period_start:.0f}"
            lease = self.leases[key] = BudgetLease(hold_id, hold.scope, hold.subject, hold.period_start)
        return lease

    async def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        leases = [self._lease(h) for h in holds]
        if all(lease.fits(h, now, self.hold_seconds) for lease, h in zip(leases, holds, strict=True)):
            self._take(leases, holds, now)
            return None
        # The store call must finish and be applied even if the request is cancelled meanwhile (a client
        # that went away): else its spend would be flushed twice. What it took is then given back.
        slow = asyncio.ensure_future(self._reserve_renewing(leases, holds, now))
        try:
            return await asyncio.shield(slow)
        except asyncio.CancelledError:
            slow.add_done_callback(lambda done: self._untake(done, leases, holds))
            raise

    @staticmethod
    def _take(leases: list[BudgetLease], holds: Sequence[Hold], now: float) -> None:
        for lease, hold in zip(leases, holds, strict=True):
            lease.holds[hold.hold_id] = hold.amount_picousd
            lease.used_at = now

    @staticmethod
    def _untake(done: asyncio.Future[Hold | None], leases: list[BudgetLease], holds: Sequence[Hold]) -> None:
        if not done.cancelled() and done.exception() is None and done.result() is None:
            for lease, hold in zip(leases, holds, strict=True):
                lease.holds.pop(hold.hold_id, None)

    async def _reserve_renewing(self, leases: list[BudgetLease], holds: Sequence[Hold], now: float
                                ) -> Hold | None:
        """Renew the leases too small for this request, under their locks. `leases` is updated in place
        to the ones the request holds (reserve's cancel path gives those back)."""
        order = sorted(range(len(holds)), key=lambda i: (holds[i].scope, holds[i].subject))
        while True:
            async with contextlib.AsyncExitStack() as stack:
                for i in order:  # one lock order for every request of this replica
                    await stack.enter_async_context(leases[i].lock)
                live = [self._lease(h) for h in holds]
                if all(a is b for a, b in zip(live, leases, strict=True)):
                    return await self._renew_locked(leases, holds, now)
            # A lease was given back (idle) while this request waited for its lock: a hold taken in it would
            # never be flushed, so the request's cost would be lost. Start over with the live leases.
            leases[:] = live

    async def _renew_locked(self, leases: list[BudgetLease], holds: Sequence[Hold], now: float
                            ) -> Hold | None:
        short = [i for i, (lease, h) in enumerate(zip(leases, holds, strict=True))
                 if not lease.fits(h, now, self.hold_seconds)]
        if short:  # not renewed by another request while this one waited for the locks
            for i in short:
                leases[i].shrinking = True
            try:
                refused = await self._renew([(leases[i], holds[i]) for i in short], now)
            finally:
                for i in short:
                    leases[i].shrinking = False
            if refused is not None:
                return refused
        self._take(leases, holds, now)
        return None

    async def _renew(self, pairs: list[tuple[BudgetLease, Hold]], now: float) -> Hold | None:
        asks = []
        for lease, hold in pairs:
            keep = lease.keep
            asks.append(LeaseAsk(lease.hold_id, lease.scope, lease.subject, lease.period_start,
                                 hold.budget_picousd, lease.spent, lease.flushed, keep,
                                 keep + hold.amount_picousd, LEASE_ASKS * hold.amount_picousd,
                                 now + 2 * self.hold_seconds))
        refused, grants = await asyncio.to_thread(self.store.renew_leases, asks, now)
        for (lease, hold), ask, grant in zip(pairs, asks, grants, strict=True):
            self._granted(lease, ask, grant, hold.budget_picousd)
        self._start_keeper()
        return pairs[refused - 1][1] if refused else None

    @staticmethod
    def _granted(lease: BudgetLease, ask: LeaseAsk, grant: LeaseGrant, budget: int) -> None:
        # requests may have settled while the store answered: only what was sent left `spent`
        lease.spent -= ask.spent_picousd
        lease.flushed += ask.spent_picousd
        lease.granted, lease.ledger_spent = grant.amount_picousd, grant.ledger_spent_picousd
        lease.budget, lease.expires_at = budget, ask.expires_at

    def settle_now(self, holds: Sequence[Hold], amount: int) -> list[tuple[Hold, int]]:
        """No I/O: the spend goes to the ledger with the next flush. (hold, the period's spend as this
        replica knows it) for each hold."""
        out = []
        for hold in holds:
            lease = self.leases.get((hold.scope, hold.subject, hold.period_start))
            if lease is not None and lease.holds.pop(hold.hold_id, None) is not None:
                lease.spent += amount
                out.append((hold, lease.ledger_spent + lease.spent))
        self._wake.set()
        return out

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        """Flush settled spend to the ledger, give idle leases back; ends when no lease is left."""
        while self.leases and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_SECONDS / 2)
            self._wake.clear()
            await asyncio.sleep(FLUSH_DELAY)  # more settlements join this flush
            await self.flush(idle_after=IDLE_SECONDS)

    async def flush(self, idle_after: float | None = None) -> None:
        """One renewal per lease with unflushed spend: the spend moves to the ledger, the lease keeps the
        rest, so requests go on being admitted meanwhile. Leases unused for `idle_after` seconds (all,
        with 0) shrink to what is in flight, and go when nothing is (admissions wait for that one)."""
        now = self.clock()
        for key, lease in list(self.leases.items()):
            idle = idle_after is not None and now - lease.used_at >= idle_after
            if not (lease.spent or idle):
                continue
            async with lease.lock:
                keep = lease.keep if idle else max(lease.granted - lease.spent, 0)
                ask = LeaseAsk(lease.hold_id, lease.scope, lease.subject, lease.period_start, lease.budget,
                               lease.spent, lease.flushed, keep, keep, 0, now + 2 * self.hold_seconds)
                lease.shrinking = idle
                try:
                    _, (grant,) = await asyncio.to_thread(self.store.renew_leases, [ask], now)
                except Exception as exc:  # StoreError, or anything else: the keeper must go on
                    self.flush_errors += 1
                    log.warning("could not flush a budget lease to the store (%s); retrying", exc)
                    continue
                finally:
                    lease.shrinking = False
                self._granted(lease, ask, grant, lease.budget)
                if idle and not lease.holds and not lease.spent and lease.granted == 0:
                    del self.leases[key]
                    if lease.budget >= 0:
                        self.last_spent[key] = lease.ledger_spent

    async def close(self) -> None:
        """Give every lease back (what is settled goes to the ledger). The keeper ends its flush first:
        a store call cut short would leave its spend to be flushed twice."""
        self._closing = True
        self._wake.set()
        if self._keeper is not None:
            await self._keeper
        await self.flush(idle_after=0.0)

    async def state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        """(spent, held) in the store, with what this replica settled but has not flushed yet counted as
        spent rather than held (held includes every replica's leases)."""
        spent, held = await asyncio.to_thread(self.store.budget_state, scope, subject, period_start, now)
        lease = self.leases.get((scope, subject, period_start))
        local = lease.spent if lease is not None else 0
        return spent + local, max(held - local, 0)

    def seen(self, scope: str, subject: str, period_start: float) -> tuple[int, int] | None:
        """(spent, held) of the period with no I/O (for /metrics): the store's ledger (every replica's
        flushed spend) at this replica's last renewal of its lease plus what it settled since, and what it
        holds for its own requests in flight (other replicas' are not known here). A lease given back leaves
        its last spend. None when this replica has not renewed a lease for the period yet."""
        key = (scope, subject, period_start)
        lease = self.leases.get(key)
        if lease is not None and lease.expires_at > 0 and lease.budget >= 0:
            return lease.ledger_spent + lease.spent, lease.keep
        spent = self.last_spent.get(key)
        return (spent, 0) if spent is not None else None
