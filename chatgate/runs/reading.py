"""The runs in a period, and one run, read from the store's records and put together
(chatgate/runs/assemble.py): what `chatgate runs`, GET /admin/runs and the dashboard show.

A run inferred from its requests' links may have begun before the period asked for; its records there are
read too, a day at a time for the keys whose runs might, so that it is listed whole and under the id it has
whatever period it is read in (at most `BACK_DAYS` days before the period)."""

from __future__ import annotations

import time

from chatgate.runs.assemble import LINK_SECONDS, Assembled, assemble, first_of, inferred_id
from chatgate.store.runs import RunHead, RunStore

BACK_DAYS = 7  # how far before the period runs are followed back to their first request
DAY = 86_400.0


def _unfinished(found: Assembled, lo: float) -> set[str]:
    """The keys of runs whose first request read continues a request older than `lo` may have made."""
    return {h.key_id for h in found.orphans if h.started - lo <= LINK_SECONDS}


def find(store: RunStore, team: str | None, key_id: str | None, since: float, limit: int,
         until: float | None = None) -> list[RunHead]:
    """The runs with a request in [since, until), the latest begun first, at most `limit`."""
    records = store.run_records(since, until, team, key_id)
    found = assemble(records)
    lo = since
    while (keys := _unfinished(found, lo)) and lo > since - BACK_DAYS * DAY:
        earlier = store.run_records(lo - DAY, lo, team, key_id, sorted(keys))
        lo -= DAY
        if earlier:
            records = earlier + records
            found = assemble(records)
    heads = [h for h in found.runs.values() if h.last_seen >= since]
    heads.sort(key=lambda h: (h.started, h.run_id), reverse=True)
    return heads[:limit]


def one(store: RunStore, run_id: str) -> RunHead | None:
    """The run of this id (stored, or inferred: its first request's), else the one stored run whose id
    starts with it; None: none."""
    named = store.named_run(run_id)
    if named:
        return next(iter(assemble(named).runs.values()), None)
    first = first_of(run_id)
    if first is None:
        return None
    ms, prefix = first
    near = [r for r in store.run_records(ms / 1000 - 0.002, ms / 1000 + 0.002, None, None)
            if r.run_id is None and r.request_id.startswith(prefix) and int(r.ts * 1000) == ms]
    if len(near) != 1:
        return None
    root = near[0]
    run_id = inferred_id(root.ts, root.request_id)
    now = time.time()
    hi = root.ts
    while True:
        hi += DAY
        records = store.run_records(root.ts, hi, None, None, [root.key_id])
        head = assemble(records).runs.get(run_id)
        if head is None or hi >= now or head.last_seen + LINK_SECONDS < hi:
            return head
