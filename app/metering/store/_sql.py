"""SQL shared by the SQLite and PostgreSQL stores.

Everything here is accepted by both dialects; only the parameter placeholder
differs (`?` for sqlite3, `%s` for psycopg).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.metering.store.base import COUNTERS, GROUP_BYS, ApiKey, GroupBy, ReportQuery, ReportRow, TurnRow

# One entry per schema version; never edit a released entry, append a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE api_keys (
            key_id TEXT PRIMARY KEY,
            key_hash TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            team TEXT NOT NULL,
            name TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            revoked_at DOUBLE PRECISION
        )""",
        """CREATE TABLE usage (
            record_id TEXT PRIMARY KEY,
            ts DOUBLE PRECISION NOT NULL,
            day TEXT NOT NULL,
            request_id TEXT NOT NULL,
            key_id TEXT NOT NULL,
            key_name TEXT NOT NULL,
            team TEXT NOT NULL,
            model TEXT NOT NULL,
            route TEXT NOT NULL,
            stream BOOLEAN NOT NULL,
            outcome TEXT NOT NULL,
            rule_code TEXT,
            upstream_status INTEGER,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            prompt_cache_hit_tokens BIGINT NOT NULL,
            prompt_cache_miss_tokens BIGINT NOT NULL,
            reasoning_tokens BIGINT NOT NULL,
            cost_picousd BIGINT NOT NULL,
            latency_ms DOUBLE PRECISION NOT NULL,
            ttfb_ms DOUBLE PRECISION,
            tokens_exact BOOLEAN NOT NULL
        )""",
        "CREATE INDEX usage_ts ON usage (ts)",
        "CREATE INDEX usage_team ON usage (team)",
        "CREATE INDEX usage_key_id ON usage (key_id)",
        "CREATE INDEX usage_model ON usage (model)",
        "CREATE INDEX usage_day ON usage (day)",
    ),
    # 2: reports filter on ts only, so the per-column indexes cost every insert and serve no query.
    (
        "DROP INDEX IF EXISTS usage_team",
        "DROP INDEX IF EXISTS usage_key_id",
        "DROP INDEX IF EXISTS usage_model",
        "DROP INDEX IF EXISTS usage_day",
    ),
    # 3: repairs (issue 12): the codes applied to each request, and the memory of relayed tool-call turns.
    (
        "ALTER TABLE usage ADD COLUMN repairs TEXT",
        """CREATE TABLE turn_memory (
            caller TEXT NOT NULL,
            kind TEXT NOT NULL,
            call_id TEXT NOT NULL,
            turn TEXT NOT NULL,
            names TEXT NOT NULL,
            payload TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (caller, kind, call_id)
        )""",
        "CREATE INDEX turn_memory_expires ON turn_memory (expires_at)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

CREATE_SCHEMA_VERSION = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)
CURRENT_VERSION = "SELECT coalesce(max(version), 0) FROM schema_version"

USAGE_COLUMNS = (
    "record_id",
    "ts",
    "day",
    "request_id",
    "key_id",
    "key_name",
    "team",
    "model",
    "route",
    "stream",
    "outcome",
    "rule_code",
    "upstream_status",
    "prompt_tokens",
    "completion_tokens",
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
    "reasoning_tokens",
    "cost_picousd",
    "latency_ms",
    "ttfb_ms",
    "tokens_exact",
    "repairs",
)
_KEY_SELECT = "SELECT key_id, name, team, prefix, created_at, revoked_at FROM api_keys"

_GROUP_FIELDS: dict[GroupBy, tuple[tuple[str, str], ...]] = {
    "key": (("key_id", "key_id"), ("key_name", "max(key_name)"), ("team", "max(team)")),
    "team": (("team", "team"),),
    "model": (("model", "model"),),
    "day": (("day", "day"),),
    "rule": (("rule_code", "coalesce(rule_code, '')"),),  # '' for requests that were not rejected
    # one row per combination of repairs; `report_rows` splits them into one row per repair code
    "repair": (("repairs", "coalesce(repairs, '')"),),
}
_COUNTER_SQL = {
    "requests": "count(*)",
    "rejected": "sum(CASE WHEN outcome = 'rejected' THEN 1 ELSE 0 END)",
    "prompt_tokens": "sum(prompt_tokens)",
    "completion_tokens": "sum(completion_tokens)",
    "prompt_cache_hit_tokens": "sum(prompt_cache_hit_tokens)",
    "prompt_cache_miss_tokens": "sum(prompt_cache_miss_tokens)",
    "reasoning_tokens": "sum(reasoning_tokens)",
    "cost_picousd": "sum(cost_picousd)",
    "estimated_requests": "sum(CASE WHEN tokens_exact THEN 0 ELSE 1 END)",
}
_COUNTER_SELECT = ", ".join(_COUNTER_SQL[name] for name in COUNTERS)


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Queries:
    """The statements of one placeholder style."""

    placeholder: str
    insert_key: str
    list_keys: str
    find_key: str
    revoke_key: str
    record_version: str
    remember_turn: str
    purge_turns: str

    @classmethod
    def with_placeholder(cls, p: str) -> Queries:
        return cls(
            placeholder=p,
            insert_key=(
                "INSERT INTO api_keys (key_id, key_hash, prefix, team, name, created_at) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
            ),
            list_keys=f"{_KEY_SELECT} ORDER BY created_at, key_id",
            find_key=f"{_KEY_SELECT} WHERE key_hash = {p}",
            revoke_key=f"UPDATE api_keys SET revoked_at = {p} WHERE key_id = {p} AND revoked_at IS NULL",
            record_version=f"INSERT INTO schema_version (version, applied_at) VALUES ({p}, {p})",
            remember_turn=(
                "INSERT INTO turn_memory (caller, kind, call_id, turn, names, payload, expires_at) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) "
                "ON CONFLICT (caller, kind, call_id) DO UPDATE SET turn = excluded.turn, "
                "names = excluded.names, payload = excluded.payload, expires_at = excluded.expires_at"
            ),
            purge_turns=f"DELETE FROM turn_memory WHERE expires_at <= {p}",
        )

    def recall_turns(self, count: int) -> str:
        ids = ", ".join([self.placeholder] * count)
        p = self.placeholder
        return ("SELECT caller, kind, call_id, turn, names, payload, expires_at FROM turn_memory "
                f"WHERE caller = {p} AND kind = {p} AND expires_at > {p} AND call_id IN ({ids})")

    def report(self, query: ReportQuery) -> tuple[str, list[float]]:
        """The aggregate query and its parameters; rows go through `report_rows`."""
        fields = _group_fields(query.group_by)
        conditions: list[str] = []
        params: list[float] = []
        if query.since is not None:
            conditions.append(f"ts >= {self.placeholder}")
            params.append(query.since)
        if query.until is not None:
            conditions.append(f"ts < {self.placeholder}")
            params.append(query.until)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        select = ", ".join(expr for _, expr in fields)
        sql = f"SELECT {select}, {_COUNTER_SELECT} FROM usage{where} GROUP BY {fields[0][0]}"
        return sql, params


def _group_fields(group_by: GroupBy) -> tuple[tuple[str, str], ...]:
    if group_by not in _GROUP_FIELDS:
        raise ValueError(f"unknown group_by {group_by!r}; expected one of {', '.join(GROUP_BYS)}")
    return _GROUP_FIELDS[group_by]


def turn_params(row: TurnRow) -> tuple[Any, ...]:
    return (row.caller, row.kind, row.call_id, row.turn, row.names, row.payload, row.expires_at)


def report_rows(group_by: GroupBy, rows: Iterable[Sequence[Any]]) -> list[ReportRow]:
    names = [name for name, _ in _GROUP_FIELDS[group_by]]
    n = len(names)
    # int(): PostgreSQL returns sum(bigint) as an exact Decimal.
    out = [
        ReportRow(
            group=dict(zip(names, (str(v) for v in row[:n]), strict=True)),
            counters=dict(zip(COUNTERS, (int(v) for v in row[n:]), strict=True)),
        )
        for row in rows
    ]
    if group_by == "repair":
        out = _split_repairs(out)
    # Sorted here rather than in SQL so both backends agree whatever PostgreSQL's collation is.
    out.sort(key=lambda r: tuple(r.group.values()))
    return out


def _split_repairs(combined: list[ReportRow]) -> list[ReportRow]:
    """Rows per combination of repairs ("a,b") -> one row per repair code (a request counts under each of
    its repairs); requests without a repair under ''."""
    out: dict[str, ReportRow] = {}
    for row in combined:
        for code in row.group["repairs"].split(",") if row.group["repairs"] else [""]:
            target = out.setdefault(code, ReportRow(group={"repair": code}))
            for name, value in row.counters.items():
                target.counters[name] += value
    return list(out.values())


def key_from_row(row: Sequence[Any]) -> ApiKey:
    key_id, name, team, prefix, created_at, revoked_at = row
    return ApiKey(
        key_id=key_id, name=name, team=team, prefix=prefix, created_at=created_at, revoked_at=revoked_at
    )


def apply_migrations(cur: Cursor, queries: Queries) -> None:
    """Apply the missing schema versions; the caller holds the migration lock in one transaction."""
    cur.execute(CREATE_SCHEMA_VERSION)
    cur.execute(CURRENT_VERSION)
    current = int(cur.fetchone()[0])
    # A newer version (written by a newer replica) is left alone: older code still works on it.
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1]:
            cur.execute(statement)
        cur.execute(queries.record_version, (version, time.time()))
