"""The runs in a period, and one run, read from the store's records and put together
(chatgate/runs/assemble.py): what `chatgate runs`, GET /admin/runs and the dashboard show.

A run inferred from its requests' links may have begun before the period asked for; its records there are
read too, a day at a time for the keys whose runs might, so that it is listed whole and under the id it has
whatever period it is read in (at most `BACK_DAYS` days before the period). Only as much of the period is
read as the runs asked for need: the latest `limit` runs begun are read from the end of it."""

from __future__ import annotations

import time

from chatgate.runs.assemble import LINK_SECONDS, Assembled, assemble, first_of, inferred_id
from chatgate.store.runs import RunHead, RunStore

BACK_DAYS = 7  # how far before the period runs are followed back to their first request
DAY = 86_400.0
HOUR = 3_600.0
MIN_PREFIX = 6  # hex digits of an inferred run's id that `one` finds it by


def _unfinished(found: Assembled, lo: float) -> set[str]:
    """The keys of runs whose first request read continues a request older than `lo` may have made."""
    return {h.key_id for h in found.orphans if h.started - lo <= LINK_SECONDS}


def find(store: RunStore, team: str | None, key_id: str | None, since: float, limit: int,
         until: float | None = None) -> list[RunHead]:
    """The runs with a request in [since, until), the latest begun first, at most `limit`. The records are
    read from the end of the period back, an hour first and four times as far each time, until `limit`
    runs began in what was read (a run begun earlier comes after them) or the period is read whole."""
    end = time.time() if until is None else until
    span = HOUR
    while True:
        lo = max(since, end - span)
        found = _assembled(store, team, key_id, lo, until)
        heads = [h for h in found.runs.values() if h.last_seen >= since and (lo <= since or h.started >= lo)]
        if len(heads) >= limit or lo <= since:
            heads.sort(key=lambda h: (h.started, h.run_id), reverse=True)
            return heads[:limit]
        span *= 4


def _assembled(store: RunStore, team: str | None, key_id: str | None, since: float, until: float | None
               ) -> Assembled:
    """The runs of the records in [since, until), each from its first request (read further back where a
    run may have begun before `since`)."""
    records = store.run_records(since, until, team, key_id)
    found = assemble(records)
    lo = since
    while (keys := _unfinished(found, lo)) and lo > since - BACK_DAYS * DAY:
        earlier = store.run_records(lo - DAY, lo, team, key_id, sorted(keys))
        lo -= DAY
        if earlier:
            records = earlier + records
            found = assemble(records)
    return found


def one(store: RunStore, run_id: str) -> RunHead | None:
    """The run of this id (stored, or inferred: its first request's), else the one run whose id starts with
    it; None: none, or several."""
    named = store.named_run(run_id)
    if named:
        return next(iter(assemble(named).runs.values()), None)
    first = first_of(run_id)
    if first is not None:
        return _inferred(store, first)
    span = _span(run_id)
    if span is None:
        return None
    lo, hi = span  # a shorter beginning: the runs begun in the span of time it names
    begun = [h for h in find(store, None, None, lo, 1000, until=hi)
             if h.run_id.startswith(run_id) and lo <= h.started < hi]
    first = first_of(begun[0].run_id) if len(begun) == 1 else None
    return None if first is None else _inferred(store, first)


def _span(prefix: str) -> tuple[float, float] | None:
    """[from, to) in seconds of the inferred run ids that begin with `prefix`: 6 to 11 hex digits (a span of
    at most 4.7 hours)."""
    if not MIN_PREFIX <= len(prefix) < 12 or any(c not in "0123456789abcdef" for c in prefix):
        return None
    return int(prefix.ljust(12, "0"), 16) / 1000, (int(prefix.ljust(12, "f"), 16) + 1) / 1000


def _inferred(store: RunStore, first: tuple[int, str]) -> RunHead | None:
    """The inferred run whose first request was made in this millisecond, with an id that begins so."""
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
