"""The limits of each team and key, looked up in the store and cached for `limits.cache_seconds` (a change
through the admin API or the CLI applies on every replica within that time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app.metering.store.base import LimitRow, Store


class LimitBook:
    def __init__(self, store: Store | None, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, LimitRow | None]] = {}

    async def get(self, scope: str, subject: str) -> LimitRow | None:
        if self.store is None:
            return None
        key = (scope, subject)
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        row = await asyncio.to_thread(self.store.get_limits, scope, subject)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now + self.ttl, row)
        return row

    def forget(self, scope: str, subject: str) -> None:
        """A change made by this process applies to it at once."""
        self._cache.pop((scope, subject), None)
