"""The limits cache (chatgate/quotas/book.py): one store look-up per subject and expiry however many requests
ask at once, and a change made by this process never overwritten by a look-up that was under way."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatgate.quotas.book import LimitBook
from chatgate.store.base import LimitRow
from chatgate.store.sqlite import SQLiteStore


class SlowStore(SQLiteStore):
    """Counts look-ups; each reads the row, then waits until the test lets it go."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lookups = 0
        self.go = threading.Event()

    def get_limits(self, scope: str, subject: str) -> LimitRow | None:
        self.lookups += 1
        row = super().get_limits(scope, subject)
        self.go.wait(5)
        return row


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SlowStore]:
    s = SlowStore(tmp_path / "b.db")
    s.migrate()
    s.set_limits(LimitRow("team", "red", rpm=5))
    yield s
    s.close()


def test_concurrent_requests_share_one_look_up(store: SlowStore) -> None:
    async def go() -> None:
        book = LimitBook(store, ttl=60.0)
        waiting = [asyncio.ensure_future(book.get("team", "red")) for _ in range(16)]
        await asyncio.sleep(0.05)
        store.go.set()
        rows = await asyncio.gather(*waiting)
        assert {r.rpm for r in rows if r is not None} == {5} and len(rows) == 16
        assert store.lookups == 1
        assert (await book.get("team", "red")) is rows[0] and store.lookups == 1, "then cached"

    asyncio.run(go())


def test_a_look_up_under_way_does_not_undo_a_change_made_here(store: SlowStore) -> None:
    async def go() -> None:
        book = LimitBook(store, ttl=60.0)
        stale = asyncio.ensure_future(book.get("team", "red"))
        await asyncio.sleep(0.05)  # reading rpm=5 ...
        store.set_limits(LimitRow("team", "red", rpm=9))  # ... while this process changes it
        book.forget("team", "red")
        store.go.set()
        await stale
        row = await book.get("team", "red")
        assert row is not None and row.rpm == 9

    asyncio.run(go())
