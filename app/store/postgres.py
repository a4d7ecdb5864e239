"""PostgreSQL store on a small psycopg connection pool.

The pool checks each connection before handing it out and reconnects in the
background, so after a server restart (or a killed backend) the store recovers
without help; while the server is away every call raises StoreError.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from app.store._sql import CURRENT_VERSION, Queries, apply_migrations, key_from_row, report_rows, usage_params
from app.store.base import ApiKey, ReportQuery, ReportRow, StoreError, UsageRecord

_Q = Queries.with_placeholder("%s")
_MIGRATION_LOCK = 0x6368_6174_6761_7465  # "chatgate": one advisory lock for every replica's migrate()

_Connection = psycopg.Connection[TupleRow]


class PostgresStore:
    def __init__(self, url: str, *, max_size: int = 4, timeout: float = 5.0) -> None:
        """`timeout` bounds how long a call waits for a connection before raising StoreError."""
        self.url = url
        self._pool: ConnectionPool[_Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=timeout,
            # Give up a reconnection attempt as soon as a caller would, so the next call starts a
            # fresh attempt instead of waiting out an exponential backoff.
            reconnect_timeout=timeout,
            check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "connect_timeout": max(2, round(timeout))},
            name="chatgate-store",
        )
        self._pool.open(wait=False)

    def migrate(self) -> None:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            apply_migrations(cur, _Q)

    def schema_version(self) -> int:
        """The applied schema version, 0 before the first migrate()."""
        with self._connection() as conn:
            row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
            if row is None or not row[0]:
                return 0
            row = conn.execute(CURRENT_VERSION).fetchone()
        return 0 if row is None else int(row[0])

    def ping(self) -> None:
        with self._connection() as conn:
            row = conn.execute("SELECT current_setting('transaction_read_only')").fetchone()
        if row is None or row[0] != "off":
            raise StoreError("PostgreSQL store: the server is read-only")

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(_Q.insert_usage, [usage_params(r) for r in records])

    def usage_report(self, query: ReportQuery) -> list[ReportRow]:
        sql, params = _Q.report(query)
        with self._connection() as conn:
            rows = conn.execute(sql, params).fetchall()
        return report_rows(query.group_by, rows)

    def create_key(self, key_id: str, key_hash: str, prefix: str, team: str, name: str) -> ApiKey:
        created_at = time.time()
        with self._connection() as conn:
            conn.execute(_Q.insert_key, (key_id, key_hash, prefix, team, name, created_at))
        return ApiKey(key_id=key_id, name=name, team=team, prefix=prefix, created_at=created_at)

    def list_keys(self) -> list[ApiKey]:
        with self._connection() as conn:
            return [key_from_row(row) for row in conn.execute(_Q.list_keys)]

    def revoke_key(self, key_id: str) -> bool:
        with self._connection() as conn:
            return conn.execute(_Q.revoke_key, (time.time(), key_id)).rowcount == 1

    def find_key(self, key_hash: str) -> ApiKey | None:
        with self._connection() as conn:
            row = conn.execute(_Q.find_key, (key_hash,)).fetchone()
        return None if row is None else key_from_row(row)

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def _connection(self) -> Iterator[_Connection]:
        """A pooled autocommit connection; every psycopg failure becomes StoreError."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL store: {str(e).strip() or type(e).__name__}") from e
