"""The rule evidence's SQL (issue 47), shared by the SQLite and PostgreSQL stores: the same statements for
both dialects, with the placeholder of each (`?` for sqlite3, `%s` for psycopg). Each function runs inside
the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from chatgate.store.base import EvidenceEvent, RuleEvidence, Unpredicted

EVIDENCE_COLUMNS = ("rule", "family", "model", "status", "confirmed", "disputed", "warned", "refused",
                    "accepted", "last_confirmed", "last_disputed", "example_request_id", "updated_at")
UNPREDICTED_COLUMNS = ("family", "model", "message", "count", "first_seen", "last_seen",
                       "example_request_ids")
EXAMPLES_KEPT = 5  # example request ids per unpredicted group: its first ones


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


_SELECT = f"SELECT {', '.join(EVIDENCE_COLUMNS)} FROM rule_evidence"


def evidence_of(row: Sequence[Any]) -> RuleEvidence:
    (rule, family, model, status, confirmed, disputed, warned, refused, accepted, last_confirmed,
     last_disputed, example, updated_at) = row
    return RuleEvidence(rule, family, model, status, int(confirmed), int(disputed), int(warned), int(refused),
                        int(accepted), _float(last_confirmed), _float(last_disputed), example,
                        float(updated_at))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def select_evidence(cur: Cursor, p: str, keys: Sequence[tuple[str, str, str]] | None, since: float | None
                    ) -> list[RuleEvidence]:
    rows: list[RuleEvidence] = []
    if keys is None:
        cur.execute(f"{_SELECT} WHERE updated_at >= {p} ORDER BY family, rule, model", (since or 0.0,))
        return [evidence_of(r) for r in cur.fetchall()]
    for rule, family, model in keys:  # a request names one to a few rules
        cur.execute(f"{_SELECT} WHERE rule = {p} AND family = {p} AND model = {p}", (rule, family, model))
        row = cur.fetchone()
        if row is not None:
            rows.append(evidence_of(row))
    return rows


def apply_event(cur: Cursor, p: str, e: EvidenceEvent, now: float) -> RuleEvidence:
    cur.execute(
        "INSERT INTO rule_evidence (rule, family, model, status, updated_at) "
        f"VALUES ({p}, {p}, {p}, {p}, {p}) ON CONFLICT (rule, family, model) DO NOTHING",
        (e.rule, e.family, e.model, e.status, now))
    where = f"WHERE rule = {p} AND family = {p} AND model = {p}"
    key = (e.rule, e.family, e.model)
    if e.event == "confirmed":
        sql = ("UPDATE rule_evidence SET status = 'enforced', confirmed = confirmed + 1, "
               f"last_confirmed = {p}, example_request_id = {p}, updated_at = {p} {where}")
        args: tuple[Any, ...] = (now, e.request_id, now, *key)
    elif e.event == "disputed":
        sql = ("UPDATE rule_evidence SET status = 'disputed', disputed = disputed + 1, "
               f"last_disputed = {p}, example_request_id = {p}, updated_at = {p} {where}")
        args = (now, e.request_id, now, *key)
    elif e.event == "warned":
        sql = f"UPDATE rule_evidence SET warned = warned + {p}, updated_at = {p} {where}"
        args = (e.count, now, *key)
    elif e.event == "accepted":
        sql = f"UPDATE rule_evidence SET accepted = accepted + {p}, updated_at = {p} {where}"
        args = (e.count, now, *key)
    elif e.event == "refused":
        # DeepSeek refused a warned request in the rule's words: a disputed rule is enforced again, a warned
        # one once it was refused `promote_after` times and never accepted
        sql = ("UPDATE rule_evidence SET refused = refused + 1, last_confirmed = "
               f"{p}, example_request_id = {p}, updated_at = {p}, status = CASE "
               "WHEN status = 'disputed' THEN 'enforced' "
               f"WHEN status = 'warned' AND {p} > 0 AND refused + 1 >= {p} AND accepted = 0 THEN 'enforced' "
               f"ELSE status END {where}")
        args = (now, e.request_id, now, e.promote_after, e.promote_after, *key)
    else:
        raise ValueError(f"unknown evidence event {e.event!r}")
    cur.execute(sql, args)
    cur.execute(f"{_SELECT} {where}", key)
    return evidence_of(cur.fetchone())


def reset(cur: Cursor, p: str, rule: str, family: str | None) -> int:
    if family is None:
        cur.execute(f"DELETE FROM rule_evidence WHERE rule = {p}", (rule,))
    else:
        cur.execute(f"DELETE FROM rule_evidence WHERE rule = {p} AND family = {p}", (rule, family))
    gone: int = cur.rowcount
    return gone


def take_lease(cur: Cursor, p: str, key: tuple[str, str, str], holder: str, now: float, expires_at: float
               ) -> bool:
    """One statement: a concurrent taker waits for the row's first writer, then finds it held."""
    cur.execute("INSERT INTO rule_leases (rule, family, model, holder, expires_at) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}) ON CONFLICT (rule, family, model) DO UPDATE SET "
                "holder = excluded.holder, expires_at = excluded.expires_at "
                f"WHERE rule_leases.expires_at <= {p}",
                (*key, holder, expires_at, now))
    taken: bool = cur.rowcount == 1
    return taken


def release_lease(cur: Cursor, p: str, key: tuple[str, str, str], holder: str) -> None:
    cur.execute(f"DELETE FROM rule_leases WHERE rule = {p} AND family = {p} AND model = {p} AND holder = {p}",
                (*key, holder))


def add_unpredicted(cur: Cursor, p: str, family: str, model: str, message: str, request_id: str, now: float
                    ) -> None:
    cur.execute(
        f"INSERT INTO unpredicted_refusals ({', '.join(UNPREDICTED_COLUMNS)}) "
        f"VALUES ({p}, {p}, {p}, 1, {p}, {p}, {p}) ON CONFLICT (family, model, message) DO UPDATE SET "
        "count = unpredicted_refusals.count + 1, last_seen = excluded.last_seen, example_request_ids = CASE "
        f"WHEN unpredicted_refusals.count < {EXAMPLES_KEPT} THEN unpredicted_refusals.example_request_ids "
        "|| ',' || excluded.example_request_ids ELSE unpredicted_refusals.example_request_ids END",
        (family, model, message, now, now, request_id.replace(",", " ")))


def select_unpredicted(cur: Cursor, p: str, since: float | None, limit: int) -> list[Unpredicted]:
    cur.execute(f"SELECT {', '.join(UNPREDICTED_COLUMNS)} FROM unpredicted_refusals WHERE last_seen >= {p} "
                f"ORDER BY count DESC, last_seen DESC LIMIT {max(1, int(limit))}", (since or 0.0,))
    return [Unpredicted(family, model, message, int(count), float(first), float(last),
                        tuple(x for x in str(examples).split(",") if x))
            for family, model, message, count, first, last, examples in cur.fetchall()]
