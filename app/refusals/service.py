"""What `chatgate refusals` and `/admin/refusals` answer, the same for both."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from app.refusals.record import Refusal
from app.refusals.store import RefusalQuery, RefusalStore
from app.refusals.view import Checker, marked, would_fix
from app.repair.base import RepairOptions

# The family that checks a route's bodies and whether it checks as /beta (None: not a route it knows).
FamilyOf = Callable[[str], "tuple[Checker, bool] | None"]


def list_refusals(store: RefusalStore, query: RefusalQuery, ttl_hours: float) -> list[dict[str, Any]]:
    rows = store.list(query, time.time() - ttl_hours * 3600)
    return [r.as_dict(with_body=False) for r in rows]


def show_refusal(store: RefusalStore, request_id: str, ttl_hours: float, family_of: FamilyOf | None = None,
                 repairs: RepairOptions | None = None) -> dict[str, Any] | None:
    """The refusal with its body, the body marked with its problems and, with `family_of` and `repairs`,
    what `lint --fix` would repair in it."""
    found = store.get(request_id, time.time() - ttl_hours * 3600)
    if found is None:
        return None
    out = found.as_dict()
    out["marked"] = marked(found)
    if family_of is not None and repairs is not None:
        out["fix"] = fix_of(found, family_of, repairs)
    return out


def fix_of(refusal: Refusal, family_of: FamilyOf, repairs: RepairOptions) -> dict[str, Any]:
    known = family_of(refusal.route)
    if known is None:
        return {"repairs": [], "problems_left": [], "note": f"no family checks route {refusal.route}"}
    family, beta = known
    return would_fix(family, refusal, beta, repairs)
