"""Budgets: a request is admitted only if, for each budget that applies, spent + held + its reservation
fits; when it ends its hold is replaced by what it cost.

`StoreBudgets` keeps the ledger in the shared store (one transaction per admission and per settlement,
atomic across replicas). `LocalBudgets` keeps it in this process (one replica), each period's spend started
from the usage the store already recorded for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.metering.store.base import Hold, Store


@dataclass(slots=True)
class Ledger:
    spent: int
    holds: dict[str, int] = field(default_factory=dict)

    @property
    def held(self) -> int:
        return sum(self.holds.values())


class LocalBudgets:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self.ledgers: dict[tuple[str, str], dict[float, Ledger]] = {}  # (scope, subject) -> period start

    async def _ledger(self, scope: str, subject: str, period_start: float) -> Ledger:
        periods = self.ledgers.get((scope, subject))
        ledger = periods.get(period_start) if periods is not None else None
        if ledger is None:
            spent = 0
            if self.store is not None:
                spent = await asyncio.to_thread(self.store.spend, scope, subject, period_start)
            # another request may have seeded it while this one waited
            ledger = self.ledgers.setdefault((scope, subject), {}).setdefault(period_start, Ledger(spent))
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
        ledgers = [await self._ledger(h.scope, h.subject, h.period_start) for h in holds]
        # From here to the end nothing awaits: the check and the holds are one step for this event loop.
        for hold, ledger in zip(holds, ledgers, strict=True):
            if ledger.spent + ledger.held + hold.amount_picousd > hold.budget_picousd:
                return hold
        for hold, ledger in zip(holds, ledgers, strict=True):
            ledger.holds[hold.hold_id] = hold.amount_picousd
        return None

    async def settle(self, holds: Sequence[Hold], amount: int, spent: bool = True) -> list[tuple[Hold, int]]:
        return self.settle_now(holds, amount)

    def settle_now(self, holds: Sequence[Hold], amount: int) -> list[tuple[Hold, int]]:
        """(hold, the ledger's spend after it) for each hold."""
        out = []
        for hold in holds:
            ledger = self.ledgers.get((hold.scope, hold.subject), {}).get(hold.period_start)
            if ledger is not None and ledger.holds.pop(hold.hold_id, None) is not None:
                ledger.spent += amount
                out.append((hold, ledger.spent))
        return out

    async def state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        ledger = await self._ledger(scope, subject, period_start)
        return ledger.spent, ledger.held


class StoreBudgets:
    def __init__(self, store: Store) -> None:
        self.store = store

    def unbudgeted(self, scope: str, subject: str) -> None:
        """Nothing to do: the store drops a subject's ledger when its budget is cleared."""

    async def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        return await asyncio.to_thread(self.store.reserve, holds, now)

    async def settle(self, holds: Sequence[Hold], amount: int, spent: bool = True) -> list[tuple[Hold, int]]:
        """With `spent`, (hold, the ledger's spend after it) for each hold (one more query each)."""
        await asyncio.to_thread(self.store.settle, holds, amount)
        if not spent:
            return []
        states = [await self.state(h.scope, h.subject, h.period_start, h.expires_at) for h in holds]
        return [(h, spent) for h, (spent, _) in zip(holds, states, strict=True)]

    async def state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        return await asyncio.to_thread(self.store.budget_state, scope, subject, period_start, now)
