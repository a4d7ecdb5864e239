"""What `chatgate refusals` and `/admin/refusals` answer, the same for both."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from chatgate.refusals.record import RefusalRecord
from chatgate.refusals.store import LIST_MAX, RefusalQuery, RefusalStore, cursor_of
from chatgate.refusals.view import Checker, marked, would_fix
from chatgate.repair.base import RepairOptions

# The family that checks a route's bodies and whether it checks as /beta (None: not a route it knows).
FamilyOf = Callable[[str], "tuple[Checker, bool] | None"]


class Ambiguous(Exception):
    """A request id that several callers' refusals carry (a client chooses its own x-request-id): which one is
    meant is not guessed; `candidates` lists them (without bodies)."""

    def __init__(self, candidates: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(candidates)} refusals of different keys carry this request id")
        self.candidates = candidates


def list_refusals(store: RefusalStore, query: RefusalQuery, ttl_hours: float
                  ) -> tuple[list[dict[str, Any]], str | None]:
    """A page of refusals, newest first, and the cursor of the next page (None: this is the last)."""
    limit = max(1, min(query.limit, LIST_MAX))
    rows = store.list(dataclasses.replace(query, limit=limit + 1), time.time() - ttl_hours * 3600)
    more = len(rows) > limit
    rows = rows[:limit]
    return [r.as_dict(with_body=False) for r in rows], cursor_of(rows[-1]) if more and rows else None


def show_refusal(store: RefusalStore, ident: str, ttl_hours: float, family_of: FamilyOf | None = None,
                 repairs: RepairOptions | None = None, key_id: str | None = None,
                 team: str | None = None) -> dict[str, Any] | None:
    """The refusal with its body, the body marked with its problems and, with `family_of` and `repairs`,
    what `lint --fix` would repair in it. `ident` is its refusal id (chatgate's own, random), or a request
    id: one of a single key's refusals (narrowed by `key_id`, `team`), else Ambiguous."""
    rows = [r for r in store.lookup(ident, time.time() - ttl_hours * 3600)
            if (key_id is None or r.key_id == key_id) and (team is None or r.team == team)]
    own = [r for r in rows if r.refusal_id == ident]
    if not own and len({r.key_id for r in rows}) > 1:
        raise Ambiguous([r.as_dict(with_body=False) for r in rows])
    found = own[0] if own else rows[0] if rows else None
    if found is None:
        return None
    out = found.as_dict()
    out["marked"] = marked(found)
    if family_of is not None and repairs is not None:
        out["fix"] = fix_of(found, family_of, repairs)
    return out


def fix_of(refusal: RefusalRecord, family_of: FamilyOf, repairs: RepairOptions) -> dict[str, Any]:
    known = family_of(refusal.route)
    if known is None:
        return {"repairs": [], "problems_left": [], "note": f"no family checks route {refusal.route}"}
    family, beta = known
    return would_fix(family, refusal, beta, repairs)
