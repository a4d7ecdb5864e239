"""The memory of relayed tool-call turns: what a client may drop and chatgate may put back.

For every answer it relays that ends in tool calls in thinking mode, chatgate remembers the reasoning under
the caller's identity and the answer's tool-call ids, in a bounded in-process cache and, where another
process may serve the next round, in the store. A caller only ever recalls its own turns. Entries expire
after `ttl` seconds and are then deleted.

A turn is durable before the client gets the end of the answer: the next round may reach another replica
at once, or this one after a restart (kill -9 included). Where another process may serve the next round
(PostgreSQL, or several worker processes on SQLite) it is in the store by then; turns relayed at the same
time are written together, one transaction for all that arrived while the previous one was written. Where
this process is the store's only user (SQLite, one worker), the cache itself is durable: its ring is a file
this process alone maps (`ring_path`, chatgate/repair/turncache.py), which the next process on it reads back.
Nothing else is written for a turn then; a turn the cache cannot answer is still looked for in the store
(turns another process wrote there).

The cache is one ring, whose oldest records go first: one tenant relaying many large turns would push the
others' out (issue 48: 140 large tool-call turns of one team turned another's repair into a 400). So each
tenant (a team in managed mode, a caller in passthrough) has a fair share of the ring, the ring divided by
the tenants with turns in it: a turn of a tenant over its share goes to the store only (where there is one),
never into the ring over the others'.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from array import array
from collections.abc import Callable, Sequence

from chatgate.bounded import BoundedDict
from chatgate.repair.base import Turn
from chatgate.repair.turncache import RingInUse, TurnCache
from chatgate.store.base import StoreError, TurnRow, TurnStore

log = logging.getLogger("chatgate.repair")

INLINE_TRIES, INLINE_RETRY_S = 8, 0.001  # writing on the event loop: tries, and the pause between them
TENANTS_KNOWN = 100_000  # callers whose tenant is remembered (beyond, the oldest forgotten first)


class TurnMemory:
    def __init__(self, store: TurnStore | None, ttl_seconds: float, cache_bytes: int,
                 clock: Callable[[], float] = time.time, ring_path: str | None = None) -> None:
        self.store = store
        # a local file may be written from the event loop when its lock is free; a server never is
        self._inline = store is not None and not store.server
        self.ttl = ttl_seconds
        self.cache_bytes = cache_bytes
        self.clock = clock
        self._cache = self._open_cache(cache_bytes, ring_path)  # no Python object per turn
        self.store_errors = 0
        self._queued: list[tuple[list[TurnRow], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._ids_prefix = uuid.uuid4().hex[:16] + "-"  # turn ids: unique across replicas, cheap
        self._ids = itertools.count()
        self._shares: dict[str, Share] = {}  # each tenant's puts in the ring
        # caller -> its tenant, as `remember` was told
        self._tenants: BoundedDict[str, str] = BoundedDict(TENANTS_KNOWN)
        self.over_share = 0  # turns not put in the ring: their tenant had its share of it
        self._pruned_at = 0  # the ring's write position when every tenant's old puts were last forgotten

    def _open_cache(self, cache_bytes: int, ring_path: str | None) -> TurnCache:
        if ring_path is not None and cache_bytes > 0:
            try:
                return TurnCache(cache_bytes, ring_path, now=self.clock())
            except RingInUse:  # another process on this spool directory: share the store with it instead
                log.warning("%s is in use by another chatgate process; relayed turns go to the store",
                            ring_path)
        return TurnCache(cache_bytes)

    @property
    def durable(self) -> bool:
        """Whether the cache alone keeps a turn across a restart (its ring is this process's file)."""
        return self._cache.durable

    def close(self) -> None:
        self._cache.close()

    @property
    def cached_bytes(self) -> int:
        return self._cache.held_bytes()

    @property
    def cached_entries(self) -> int:
        return self._cache.entries()

    async def remember(self, caller: str, kind: str, turn: Turn, tenant: str | None = None) -> None:
        """Remember a relayed turn; returns once it is durable: in the cache's file, or in the store (or the
        store has failed to take it: then this process alone remembers it). `tenant` (the caller's team, or
        the caller) has its fair share of the cache."""
        if not turn.call_ids or len(set(turn.call_ids)) != len(turn.call_ids):
            return
        expires = self.clock() + self.ttl
        turn_id = f"{self._ids_prefix}{next(self._ids)}"
        names = ",".join(turn.names)
        rows = [TurnRow(caller, kind, call_id, turn_id, names, turn.payload, expires)
                for call_id in turn.call_ids]
        tenant = tenant if tenant is not None else caller
        if self._tenants.get(caller) != tenant:
            self._tenants[caller] = tenant
        cached = self._within_share(tenant, rows)
        if cached:
            for row in rows:
                self._put(row)
        if self.store is None or (self._cache.durable and cached):
            return
        if (self._inline and not self._queued and (self._writer is None or self._writer.done())
                and self._write_now(rows)):
            return
        done = asyncio.get_running_loop().create_future()
        self._queued.append((rows, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(done)

    def _write_now(self, rows: list[TurnRow]) -> bool:
        """Write on the event loop, when the store can without waiting (most turns: no task, no future)."""
        assert self.store is not None
        try:
            return self.store.try_remember_turns(rows)
        except StoreError as exc:
            self.store_errors += 1
            log.warning("could not store a relayed turn for restoring (%s); kept in this process only", exc)
            return True

    async def drain(self) -> None:
        """Wait until every turn written here so far is in the store, or could not be written."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def _write(self) -> None:
        """Write what is queued, batch after batch, until nothing is left; each waiter learns when its batch
        is in the store (or could not be written: this replica still remembers it, others will not)."""
        assert self.store is not None
        while self._queued:
            batch, self._queued = self._queued, []
            written = [row for turn_rows, _ in batch for row in turn_rows]
            try:
                if not await self._write_inline(written):
                    await asyncio.to_thread(self.store.remember_turns, written)
            except StoreError as exc:
                self.store_errors += 1
                log.warning("could not store %d relayed turn(s) for restoring (%s); kept in this process "
                            "only", len(batch), exc)
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _write_inline(self, rows: list[TurnRow]) -> bool:
        """Write on the event loop if the local write lock frees up within a few ms (it is mostly busy for
        a usage batch); False: a worker thread must wait for it."""
        assert self.store is not None
        for _ in range(INLINE_TRIES if self._inline else 0):
            if self.store.try_remember_turns(rows):
                return True
            await asyncio.sleep(INLINE_RETRY_S)
        return False

    def _cached(self, caller: str, kind: str, call_ids: Sequence[str]) -> dict[str, TurnRow]:
        """The caller's unexpired rows for these ids that this process's cache holds (no store look-up)."""
        now = self.clock()
        found: dict[str, TurnRow] = {}
        for call_id in call_ids:
            cached = self._cache.get(_key(caller, kind, call_id), now)
            if cached is not None:
                found[call_id] = TurnRow(caller, kind, call_id, *cached)
        return found

    async def recall(self, caller: str, kind: str, call_ids: Sequence[str]) -> dict[str, TurnRow]:
        """The caller's unexpired rows for these ids: the cache first, then the shared store."""
        found = self._cached(caller, kind, call_ids)
        if len(found) == len(call_ids):
            return found
        now = self.clock()
        missing = [c for c in dict.fromkeys(call_ids) if c not in found]
        if missing and self.store is not None:
            try:
                rows = await asyncio.to_thread(self.store.recall_turns, caller, kind, missing, now)
            except StoreError as exc:
                self.store_errors += 1
                log.warning("could not look up relayed turns for restoring: %s", exc)
                rows = []
            mine = [row for row in rows if row.caller == caller and row.kind == kind]
            cache = self._within_share(self._tenants.get(caller, caller), mine) if mine else False
            for row in mine:
                found[row.call_id] = row
                if cache:
                    self._put(row)
        return found

    async def purge(self) -> int:
        """Delete what has expired, here and in the store; how many rows the store deleted."""
        now = self.clock()
        self._cache.purge(now)
        if self.store is None:
            return 0
        try:
            return await asyncio.to_thread(self.store.purge_turns, now)
        except StoreError as exc:
            log.warning("could not purge expired turns: %s", exc)
            return 0

    def _within_share(self, tenant: str, rows: list[TurnRow]) -> bool:
        """Whether the tenant's turns in the ring, these rows' with them, fit its fair share: the ring
        divided by the tenants with turns in it. Counted from the ring's write position: a put is in the ring
        while fewer than its size of bytes follow it."""
        cache = self._cache
        size = cache.size
        if size <= 0:
            return True
        oldest = cache.written - size
        if cache.written - self._pruned_at >= size // 16:  # every tenant's, now and then (a tenant each
            self._pruned_at = cache.written            # time cost every turn a loop over all of them)
            for name in list(self._shares):
                if not self._shares[name].live(oldest):
                    del self._shares[name]
        elif (own := self._shares.get(tenant)) is not None and not own.live(oldest):
            del self._shares[tenant]
        wanted = sum(len(r.caller) + len(r.kind) + len(r.call_id) + len(r.turn) + len(r.names)
                     + len(r.payload) + 48 for r in rows)
        mine = self._shares.get(tenant)
        tenants = len(self._shares) + (mine is None)
        held = mine.held if mine is not None else 0
        if held + wanted > size // tenants and tenants > 1:
            self.over_share += 1
            return False
        if mine is None:
            mine = self._shares[tenant] = Share()
        mine.add(cache.written + wanted, wanted)
        return True

    def _put(self, row: TurnRow) -> None:
        self._cache.put(_key(row.caller, row.kind, row.call_id), row.turn, row.names, row.payload,
                        row.expires_at)


class Share:
    """One tenant's puts in the ring: where each ends and its bytes, in two arrays (no object per turn)."""

    def __init__(self) -> None:
        self.ends = array("q")
        self.sizes = array("q")
        self.head = 0  # the puts before it have left the ring
        self.held = 0

    def add(self, end: int, size: int) -> None:
        self.ends.append(end)
        self.sizes.append(size)
        self.held += size

    def live(self, oldest: int) -> bool:
        """Forget the puts the ring has overwritten (written before `oldest`); whether any is left."""
        ends, head = self.ends, self.head
        while head < len(ends) and ends[head] <= oldest:
            self.held -= self.sizes[head]
            head += 1
        if head > 1024 and head * 2 > len(ends):
            del self.ends[:head], self.sizes[:head]
            head = 0
        self.head = head
        return head < len(ends)


def _key(caller: str, kind: str, call_id: str) -> str:
    return f"{caller}\x00{kind}\x00{call_id}"  # callers and kinds are chatgate's own names, without NUL
