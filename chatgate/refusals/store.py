"""The refusals table, in the same database as the usage store (SQLite or PostgreSQL), so every replica
sees every replica's refusals. Its own connections and its own `CREATE TABLE IF NOT EXISTS`: it shares the
database, not the usage store's code. Synchronous: called from the inspector's writer thread and from
`asyncio.to_thread` (admin API) or the CLI."""

from __future__ import annotations

import builtins
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from chatgate.refusals.record import RefusalRecord
from chatgate.store.sqlite import create_private

COLUMNS = ("refusal_id", "request_id", "ts", "replica", "key_id", "key_name", "team", "route", "model",
           "status", "source", "rules", "problems", "body", "redacted")
LIST_MAX = 1000
FIND_MAX = 20


class RefusalStoreError(Exception):
    """The database could not be reached or refused the operation."""


@dataclass(frozen=True, slots=True)
class RefusalQuery:
    team: str | None = None
    key_id: str | None = None
    rule: str | None = None
    since: float | None = None  # unix seconds, inclusive
    limit: int = 100
    after: tuple[float, str] | None = None  # the page after this (ts, refusal_id): a list's `next_cursor`


def cursor_of(refusal: RefusalRecord) -> str:
    return f"{refusal.ts!r}_{refusal.refusal_id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """A `next_cursor` as the query's `after` (ValueError when it is not one)."""
    ts, sep, refusal_id = cursor.partition("_")
    if not sep or not refusal_id:
        raise ValueError(f"not a cursor: {cursor[:64]!r}")
    return float(ts), refusal_id


class RefusalStore(Protocol):
    def migrate(self) -> None: ...

    def insert(self, rows: Sequence[RefusalRecord], replica: str, keep: int, expired_before: float) -> None:
        """Insert the rows (in one transaction) and keep only the replica's last `keep`; rows older than
        `expired_before` go too."""

    def list(self, query: RefusalQuery, expired_before: float) -> list[RefusalRecord]:
        """Newest first."""

    def lookup(self, ident: str, expired_before: float) -> builtins.list[RefusalRecord]:
        """The refusals whose refusal id (chatgate's own) or request id (maybe a client's: several clients
        may send the same one) is `ident`, newest first, at most FIND_MAX."""

    def purge(self, expired_before: float) -> int: ...

    def close(self) -> None: ...


def open_refusal_store(url: str) -> RefusalStore:
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "sqlite":
        return SQLiteRefusals(rest[1:])
    if sep and scheme in ("postgresql", "postgres"):
        return PostgresRefusals(url)
    raise ValueError("the refusal inspector needs a sqlite:/// or postgresql:// store URL")


def _params(r: RefusalRecord) -> tuple[Any, ...]:
    rules = "," + ",".join(r.rules) + "," if r.rules else ""  # ,R16,R3, : a rule matches as ,R16,
    return (r.refusal_id, r.request_id, r.ts, r.replica, r.key_id, r.key_name, r.team, r.route, r.model,
            r.status, r.source, rules, orjson.dumps(r.problems).decode(), r.body, bool(r.redacted))


def _row(row: Sequence[Any]) -> RefusalRecord:
    (refusal_id, request_id, ts, replica, key_id, key_name, team, route, model, status, source, rules,
     problems, body, redacted) = row
    return RefusalRecord(refusal_id, request_id, float(ts), replica, key_id, key_name, team, route, model,
                   int(status), source, tuple(x for x in str(rules).split(",") if x), orjson.loads(problems),
                   body, bool(redacted))


def _where(query: RefusalQuery, expired_before: float, ph: str, find: str) -> tuple[str, list[Any]]:
    clauses: list[str] = [f"ts >= {ph}"]
    args: list[Any] = [max(expired_before, query.since or 0.0)]
    if query.team is not None:
        clauses.append(f"team = {ph}")
        args.append(query.team)
    if query.key_id is not None:
        clauses.append(f"key_id = {ph}")
        args.append(query.key_id)
    if query.rule is not None:
        clauses.append(f"{find}(rules, {ph}) > 0")
        args.append(f",{query.rule},")
    if query.after is not None:  # the order of the list: ts descending, then refusal_id
        clauses.append(f"(ts < {ph} OR (ts = {ph} AND refusal_id > {ph}))")
        args.extend([query.after[0], query.after[0], query.after[1]])
    return " AND ".join(clauses), args


class _SQL:
    ph = "?"
    find = "instr"
    schema: tuple[str, ...] = ()

    def _execute(self, sql: str, args: Sequence[Any] = (), many: Sequence[Sequence[Any]] | None = None
                 ) -> list[Any]:
        raise NotImplementedError

    def insert_sql(self) -> str:
        marks = ", ".join([self.ph] * len(COLUMNS))
        return f"INSERT INTO refusals ({', '.join(COLUMNS)}) VALUES ({marks}) ON CONFLICT DO NOTHING"

    def trim_sql(self) -> str:
        p = self.ph
        return (f"DELETE FROM refusals WHERE replica = {p} AND ts < "
                f"(SELECT ts FROM refusals WHERE replica = {p} "
                f"ORDER BY ts DESC LIMIT 1 OFFSET {p})")

    def list(self, query: RefusalQuery, expired_before: float) -> list[RefusalRecord]:
        where, args = _where(query, expired_before, self.ph, self.find)
        limit = max(1, min(query.limit, LIST_MAX + 1))  # one more: whether there is a next page
        rows = self._execute(f"SELECT {', '.join(COLUMNS)} FROM refusals WHERE {where} "
                             f"ORDER BY ts DESC, refusal_id LIMIT {limit}", args)
        return [_row(r) for r in rows]

    def lookup(self, ident: str, expired_before: float) -> builtins.list[RefusalRecord]:
        p = self.ph
        rows = self._execute(f"SELECT {', '.join(COLUMNS)} FROM refusals "
                             f"WHERE (refusal_id = {p} OR request_id = {p}) AND ts >= {p} "
                             f"ORDER BY ts DESC LIMIT {FIND_MAX}", [ident, ident, expired_before])
        return [_row(r) for r in rows]


SCHEMA_SQLITE = (
    "CREATE TABLE IF NOT EXISTS refusals (refusal_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, "
    "ts REAL NOT NULL, replica TEXT NOT NULL, key_id TEXT NOT NULL, key_name TEXT NOT NULL, "
    "team TEXT NOT NULL, "
    "route TEXT NOT NULL, model TEXT NOT NULL, status INTEGER NOT NULL, source TEXT NOT NULL, "
    "rules TEXT NOT NULL, problems TEXT NOT NULL, body TEXT NOT NULL, redacted INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS refusals_ts ON refusals (ts)",
    "CREATE INDEX IF NOT EXISTS refusals_replica_ts ON refusals (replica, ts)",
    "CREATE INDEX IF NOT EXISTS refusals_request ON refusals (request_id)",
)


class SQLiteRefusals(_SQL):
    """One connection per thread (the writer thread, the threads of asyncio.to_thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            create_private(Path(self.path))
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _execute(self, sql: str, args: Sequence[Any] = (), many: Sequence[Sequence[Any]] | None = None
                 ) -> list[Any]:
        try:
            conn = self._conn()
            if many is not None:
                conn.executemany(sql, many)
                return []
            return conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise RefusalStoreError(f"{type(exc).__name__}: {exc}") from None

    def migrate(self) -> None:
        for statement in SCHEMA_SQLITE:
            self._execute(statement)

    def insert(self, rows: Sequence[RefusalRecord], replica: str, keep: int, expired_before: float) -> None:
        try:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(self.insert_sql(), [_params(r) for r in rows])
                conn.execute(self.trim_sql(), (replica, replica, keep - 1))
                conn.execute("DELETE FROM refusals WHERE ts < ?", (expired_before,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise RefusalStoreError(f"{type(exc).__name__}: {exc}") from None

    def purge(self, expired_before: float) -> int:
        try:
            return self._conn().execute("DELETE FROM refusals WHERE ts < ?", (expired_before,)).rowcount
        except sqlite3.Error as exc:
            raise RefusalStoreError(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()


SCHEMA_POSTGRES = (
    "CREATE TABLE IF NOT EXISTS refusals (refusal_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, "
    "ts DOUBLE PRECISION NOT NULL, replica TEXT NOT NULL, key_id TEXT NOT NULL, key_name TEXT NOT NULL, "
    "team TEXT NOT NULL, route TEXT NOT NULL, model TEXT NOT NULL, status INTEGER NOT NULL, "
    "source TEXT NOT NULL, rules TEXT NOT NULL, problems TEXT NOT NULL, body TEXT NOT NULL, "
    "redacted BOOLEAN NOT NULL)",
    "CREATE INDEX IF NOT EXISTS refusals_ts ON refusals (ts)",
    "CREATE INDEX IF NOT EXISTS refusals_replica_ts ON refusals (replica, ts)",
    "CREATE INDEX IF NOT EXISTS refusals_request ON refusals (request_id)",
)
MIGRATE_LOCK = 0x63677266  # pg_advisory_xact_lock key: replicas create the table one at a time


class PostgresRefusals(_SQL):
    """A connection per thread, opened on first use and again after a failure."""

    ph = "%s"
    find = "strpos"

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()

    def _conn(self) -> Any:
        import psycopg

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _run(self, work: Any) -> Any:
        import psycopg

        try:
            return work(self._conn())
        except psycopg.Error as exc:
            self._local.conn = None
            raise RefusalStoreError(f"{type(exc).__name__}: {exc}") from None

    def _execute(self, sql: str, args: Sequence[Any] = (), many: Sequence[Sequence[Any]] | None = None
                 ) -> list[Any]:
        def work(conn: Any) -> list[Any]:
            cur = conn.execute(sql, args)
            return list(cur.fetchall()) if cur.description is not None else []
        result: list[Any] = self._run(work)
        return result

    def migrate(self) -> None:
        def work(conn: Any) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
                for statement in SCHEMA_POSTGRES:
                    conn.execute(statement)
        self._run(work)

    def insert(self, rows: Sequence[RefusalRecord], replica: str, keep: int, expired_before: float) -> None:
        def work(conn: Any) -> None:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(self.insert_sql(), [_params(r) for r in rows])
                cur.execute(self.trim_sql(), (replica, replica, keep - 1))
                cur.execute("DELETE FROM refusals WHERE ts < %s", (expired_before,))
        self._run(work)

    def purge(self, expired_before: float) -> int:
        def work(conn: Any) -> int:
            return int(conn.execute("DELETE FROM refusals WHERE ts < %s", (expired_before,)).rowcount)
        result: int = self._run(work)
        return result

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
