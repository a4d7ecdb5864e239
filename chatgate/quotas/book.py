"""The limits of each team and key, looked up in the store and cached for `limits.cache_seconds` (a change
through the admin API or the CLI applies on every replica within that time)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from chatgate.bounded import BoundedDict
from chatgate.store.base import LimitRow, LimitStore

ROWS_KEPT = 10_000  # teams' and keys' rows cached (beyond, the oldest entry is forgotten)


class LimitBook:
    def __init__(self, store: LimitStore | None, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._cache: BoundedDict[tuple[str, str], tuple[float, LimitRow | None]] = BoundedDict(ROWS_KEPT)
        self._loading: dict[tuple[str, str], asyncio.Future[LimitRow | None]] = {}
        self.generation = 0  # counts the forgets: what was worked out from rows before one may be stale

    async def get(self, scope: str, subject: str) -> LimitRow | None:
        if self.store is None:
            return None
        key = (scope, subject)
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        loading = self._loading.get(key)
        if loading is None:  # one look-up per expiry, however many requests arrive meanwhile
            loading = self._loading[key] = asyncio.ensure_future(self._load(key, now))
        return await asyncio.shield(loading)

    def until(self, scope: str, subject: str, row: LimitRow | None) -> float:
        """Until when (on `clock`) `get` hands out `row` without a look-up, unless a row is forgotten first
        (`generation`); 0 when it would not hand it out now."""
        if self.store is None:
            return math.inf if row is None else 0.0
        cached = self._cache.get((scope, subject))
        return cached[0] if cached is not None and cached[1] is row else 0.0

    async def _load(self, key: tuple[str, str], now: float) -> LimitRow | None:
        assert self.store is not None
        me = asyncio.current_task()
        try:
            row = await asyncio.to_thread(self.store.get_limits, *key)
        finally:
            current = self._loading.get(key) is me
            if current:
                del self._loading[key]
        if current:  # not forgotten meanwhile: a row read before a change must not be kept
            if len(self._cache) >= ROWS_KEPT and key not in self._cache:
                self.generation += 1  # a row is forgotten (the oldest) to make room
            self._cache[key] = (now + self.ttl, row)
        return row

    def budgeted(self) -> list[LimitRow]:
        """The rows with a budget this book holds, expired ones too (the last read of each; a row forgotten
        is gone): at most the ROWS_KEPT rows it keeps."""
        return [row for _, row in list(self._cache.values())
                if row is not None and row.budget_picousd is not None]

    def forget(self, scope: str, subject: str) -> None:
        """A change made by this process applies to it at once (a look-up under way is not cached)."""
        self._cache.pop((scope, subject), None)
        self._loading.pop((scope, subject), None)
        self.generation += 1
