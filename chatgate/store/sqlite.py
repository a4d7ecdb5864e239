"""SQLite store: one WAL-mode connection per thread, shared safely with other processes."""

from __future__ import annotations

import functools
import itertools
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from chatgate.store._evidence import (
    add_unpredicted,
    apply_event,
    release_lease,
    reset,
    select_evidence,
    select_unpredicted,
    take_lease,
)
from chatgate.store._sql import (
    CURRENT_VERSION,
    TURN_WIDTH,
    USAGE_COLUMNS,
    Queries,
    apply_migrations,
    file_id_chunks,
    file_owner_params,
    key_from_row,
    limit_from_row,
    limit_params,
    renew_in,
    report_rows,
    reserve_in,
    settle_in,
    turn_params,
)
from chatgate.store.base import (
    ApiKey,
    EvidenceEvent,
    FileOwner,
    Hold,
    LeaseAsk,
    LeaseGrant,
    LimitRow,
    ReportQuery,
    ReportRow,
    RuleEvidence,
    StoreError,
    StoreRefused,
    TurnRow,
    Unpredicted,
    UsageRecord,
)
from chatgate.store.runs import RunHead, RunRecord, head_in, named_in, recent_in, records_in, thread_in

_Q = Queries.with_placeholder("?")


# Rows go in as multi-row VALUES statements: Python binds every parameter of a statement in one C call
# and SQLite inserts them outside the GIL, so the writer thread hardly competes with the event loop.
# (A JSON array unpacked with json_extract was tried: SQLite before 3.45 re-parses the record for each of
# its 22 columns, ~4x the CPU per row.) Statements come in power-of-two sizes, so a handful are prepared
# once and cached whatever the batch sizes.
_FIELDS = tuple(c for c in USAGE_COLUMNS if c != "day")
_ROW_VALUES = operator.attrgetter(*_FIELDS)
_MAX_ROWS = 256


def _select_column(column: str) -> str:
    if column == "day":
        return f"strftime('%Y-%m-%d', column{_FIELDS.index('ts') + 1}, 'unixepoch')"
    return f"column{_FIELDS.index(column) + 1}"


@functools.cache
def _insert_rows(n: int) -> str:
    row = "(" + ", ".join("?" * len(_FIELDS)) + ")"
    return (
        f"INSERT INTO usage ({', '.join(USAGE_COLUMNS)}) "
        f"SELECT {', '.join(_select_column(c) for c in USAGE_COLUMNS)} FROM (VALUES {', '.join([row] * n)}) "
        "WHERE true ON CONFLICT (record_id) DO NOTHING"
    )


def _chunk_sizes(total: int, largest: int) -> Iterator[int]:
    """`total` as a sum of powers of two, each at most `largest` (itself a power of two)."""
    size = largest
    while total:
        while size > total:
            size //= 2
        yield size
        total -= size


class SQLiteStore:
    server = False
    def __init__(
        self, path: str | os.PathLike[str], *, url: str | None = None, busy_timeout_ms: int = 5000
    ) -> None:
        self.path = Path(path)
        self.url = url or f"sqlite:///{self.path}"
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._local = threading.local()
        self._lock = threading.Lock()
        # This process's writers (the usage writer, turn memory, budgets) take turns here: a thread waiting
        # on a lock wakes when it is released, where SQLite's busy handler sleeps and polls (ms at a time).
        self._writing = threading.Lock()
        self._inline: sqlite3.Connection | None = None
        self._conns: dict[threading.Thread, sqlite3.Connection] = {}
        self._closed = False

    def migrate(self) -> None:
        with self._write() as conn:
            apply_migrations(conn.cursor(), _Q)

    def schema_version(self) -> int:
        """The applied schema version, 0 before the first migrate()."""
        with self._errors():
            conn = self._conn()
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone() is None:
                return 0
            return int(conn.execute(CURRENT_VERSION).fetchone()[0])

    def ping(self) -> None:
        with self._errors():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        if records:
            with self._write() as conn:
                self._insert_usage(conn, records)

    def insert_batch(self, records: Sequence[UsageRecord], turns: Sequence[TurnRow]) -> None:
        if records or turns:
            with self._write() as conn:
                self._insert_usage(conn, records)
                self._insert_turns(conn, turns)

    def _insert_usage(self, conn: sqlite3.Connection, records: Sequence[UsageRecord]) -> None:
        params = list(itertools.chain.from_iterable(map(_ROW_VALUES, records)))
        width = len(_FIELDS)
        start = 0
        for n in _chunk_sizes(len(records), self._max_rows(conn, width)):
            conn.execute(_insert_rows(n), params[start:start + n * width])
            start += n * width

    def _insert_turns(self, conn: sqlite3.Connection, rows: Sequence[TurnRow]) -> None:
        params = list(itertools.chain.from_iterable(map(turn_params, rows)))
        start = 0
        for n in _chunk_sizes(len(rows), self._max_rows(conn, TURN_WIDTH)):
            conn.execute(_Q.remember_turns(n), params[start:start + n * TURN_WIDTH])
            start += n * TURN_WIDTH

    def _max_rows(self, conn: sqlite3.Connection, width: int) -> int:
        """The largest power-of-two row count (≤ 256) whose parameters fit this SQLite's variable limit."""
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width
        rows = _MAX_ROWS
        while rows > max(limit, 1):
            rows //= 2
        return rows

    def usage_report(self, query: ReportQuery) -> list[ReportRow]:
        sql, params = _Q.report(query)
        with self._errors():
            rows = self._conn().execute(sql, params).fetchall()
        return report_rows(query.group_by, rows)

    def latencies(self, query: ReportQuery, limit: int) -> list[tuple[str, float]]:
        sql, params = _Q.latencies(query, limit)
        with self._errors():
            return [(str(model), float(ms)) for model, ms in self._conn().execute(sql, params).fetchall()]

    def create_key(self, key_id: str, key_hash: str, prefix: str, team: str, name: str) -> ApiKey:
        created_at = time.time()
        with self._write() as conn:
            conn.execute(_Q.insert_key, (key_id, key_hash, prefix, team, name, created_at))
        return ApiKey(key_id=key_id, name=name, team=team, prefix=prefix, created_at=created_at)

    def list_keys(self) -> list[ApiKey]:
        with self._errors():
            return [key_from_row(row) for row in self._conn().execute(_Q.list_keys)]

    def revoke_key(self, key_id: str) -> bool:
        with self._write() as conn:
            return conn.execute(_Q.revoke_key, (time.time(), key_id)).rowcount == 1

    def find_key(self, key_hash: str) -> ApiKey | None:
        with self._errors():
            row = self._conn().execute(_Q.find_key, (key_hash,)).fetchone()
        return None if row is None else key_from_row(row)

    def try_remember_turns(self, rows: Sequence[TurnRow]) -> bool:
        """A small local write (~0.2 ms) done on the caller's thread: handing it to a worker thread costs
        that thread a GIL hand-off per statement, up to 5 ms each while the event loop is busy. Only
        if nothing has to be waited for: this process's write lock is free, the file's write lock is
        taken without a busy wait (timeout 0), and this connection never checkpoints the WAL."""
        if not rows:
            return True
        if not self._writing.acquire(blocking=False):
            return False
        try:
            with self._errors():
                conn = self._inline_conn()
                if conn is None:
                    return False
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as e:
                    if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                        return False
                    raise
                try:
                    self._insert_turns(conn, rows)
                    conn.execute("COMMIT")
                except BaseException:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            return True
        finally:
            self._writing.release()

    def _inline_conn(self) -> sqlite3.Connection | None:
        """The connection of `try_remember_turns` (used under `_writing` only); None if the file is not in
        WAL mode yet."""
        if self._closed:
            raise StoreError(f"SQLite store {self.path} is closed")
        if self._inline is None:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.close()
                return None
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the other connections checkpoint
            self._inline = conn
        return self._inline

    def remember_turns(self, rows: Sequence[TurnRow]) -> None:
        if rows:
            with self._write() as conn:
                self._insert_turns(conn, rows)

    def recall_turns(self, caller: str, kind: str, call_ids: Sequence[str], now: float) -> list[TurnRow]:
        if not call_ids:
            return []
        with self._errors():
            rows = self._conn().execute(_Q.recall_turns(len(call_ids)), (caller, kind, now, *call_ids))
            return [TurnRow(*row) for row in rows]

    def purge_turns(self, now: float) -> int:
        with self._write() as conn:
            return int(conn.execute(_Q.purge_turns, (now,)).rowcount)

    # --- the owners of uploaded files ---

    def own_file(self, owner: FileOwner) -> bool:
        with self._write() as conn:
            return conn.execute(_Q.own_file, file_owner_params(owner)).rowcount == 1

    def file_owner(self, file_id: str) -> FileOwner | None:
        with self._errors():
            conn = self._conn()
            row = conn.execute(_Q.file_owner, (file_id,)).fetchone()
        return None if row is None else FileOwner(*row)

    def files_owned(self, team: str, file_ids: Sequence[str]) -> set[str]:
        owned: set[str] = set()
        with self._errors():
            conn = self._conn()
            for chunk in file_id_chunks(file_ids):
                owned.update(row[0] for row in conn.execute(_Q.files_owned(len(chunk)), (team, *chunk)))
        return owned

    def file_tokens(self, file_ids: Sequence[str]) -> dict[str, int | None]:
        found: dict[str, int | None] = {}
        with self._errors():
            conn = self._conn()
            for chunk in file_id_chunks(file_ids):
                rows = conn.execute(_Q.file_tokens(len(chunk)), tuple(chunk))
                found.update((row[0], row[1]) for row in rows)
        return found

    def disown_file(self, file_id: str) -> bool:
        with self._write() as conn:
            return conn.execute(_Q.disown_file, (file_id,)).rowcount == 1

    # --- limits and budgets ---

    def get_limits(self, scope: str, subject: str) -> LimitRow | None:
        with self._errors():
            row = self._conn().execute(_Q.get_limits, (scope, subject)).fetchone()
        return None if row is None else limit_from_row(row)

    def list_limits(self, scope: str) -> list[LimitRow]:
        with self._errors():
            return [limit_from_row(row) for row in self._conn().execute(_Q.list_limits, (scope,))]

    def set_limits(self, row: LimitRow) -> None:
        with self._write() as conn:
            if row.empty:
                conn.execute(_Q.delete_limits, (row.scope, row.subject))
            else:
                conn.execute(_Q.upsert_limits, limit_params(row))
            if row.budget_picousd is None:
                conn.execute(_Q.drop_ledger, (row.scope, row.subject))

    def spend(self, scope: str, subject: str, since: float, currency: str | None = None) -> int:
        with self._errors():
            return int(self._conn().execute(_Q.spend(scope), (subject, since, currency)).fetchone()[0])

    def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        """BEGIN IMMEDIATE holds the database's write lock for the whole check: nothing can interleave."""
        with self._errors(), self._writing:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                refused = reserve_in(conn.cursor(), _Q, holds, now)
                conn.execute("ROLLBACK" if refused is not None else "COMMIT")
            except BaseException:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        return refused

    def settle(self, holds: Sequence[Hold], amount_picousd: int) -> None:
        with self._write() as conn:
            settle_in(conn.cursor(), _Q, holds, amount_picousd)

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        with self._write() as conn:
            return renew_in(conn.cursor(), _Q, asks, now)

    def budget_state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        with self._errors():
            conn = self._conn()
            row = conn.execute(_Q.ledger_spent, (scope, subject, period_start)).fetchone()
            spent = int(row[0]) if row is not None else self.spend(scope, subject, period_start)
            held = int(conn.execute(_Q.held, (scope, subject, period_start, now)).fetchone()[0])
        return spent, held

    def purge_holds(self, now: float) -> int:
        with self._write() as conn:
            return int(conn.execute(_Q.purge_holds, (now,)).rowcount)

    def mark_alert(self, scope: str, subject: str, period_start: float, level: str, now: float) -> bool:
        with self._write() as conn:
            return conn.execute(_Q.mark_alert, (scope, subject, period_start, level, now)).rowcount == 1

    def run_records(self, since: float, until: float | None, team: str | None, key_id: str | None,
                    keys: Sequence[str] | None = None) -> list[RunRecord]:
        with self._errors():
            return records_in(self._conn().cursor(), "?", since, until, team, key_id, keys)

    def named_run(self, run_id: str) -> list[RunRecord]:
        with self._errors():
            return named_in(self._conn().cursor(), "?", run_id)

    def run_head(self, run_id: str) -> RunHead | None:
        with self._errors():
            return head_in(self._conn().cursor(), "?", run_id)

    def run_of_thread(self, thread: str) -> RunHead | None:
        with self._errors():
            return thread_in(self._conn().cursor(), "?", thread)

    def recent_runs(self, since: float, limit: int) -> list[RunHead]:
        with self._errors():
            return recent_in(self._conn().cursor(), "?", since, limit)

    # --- the rules' evidence (issue 47) ---

    def rule_evidence(self, keys: Sequence[tuple[str, str, str]] | None = None, since: float | None = None
                      ) -> list[RuleEvidence]:
        with self._errors():
            return select_evidence(self._conn().cursor(), "?", keys, since)

    def record_evidence(self, events: Sequence[EvidenceEvent], now: float) -> list[RuleEvidence]:
        with self._write() as conn:
            cur = conn.cursor()
            return [apply_event(cur, "?", e, now) for e in events]

    def reset_evidence(self, rule: str, family: str | None = None) -> int:
        with self._write() as conn:
            return reset(conn.cursor(), "?", rule, family)

    def take_rule_lease(self, key: tuple[str, str, str], holder: str, now: float, expires_at: float) -> bool:
        with self._write() as conn:
            return take_lease(conn.cursor(), "?", key, holder, now, expires_at)

    def release_rule_lease(self, key: tuple[str, str, str], holder: str) -> None:
        with self._write() as conn:
            release_lease(conn.cursor(), "?", key, holder)

    def record_unpredicted(self, family: str, model: str, message: str, request_id: str, now: float) -> None:
        with self._write() as conn:
            add_unpredicted(conn.cursor(), "?", family, model, message, request_id, now)

    def unpredicted(self, since: float | None = None, limit: int = 100) -> list[Unpredicted]:
        with self._errors():
            return select_unpredicted(self._conn().cursor(), "?", since, limit)

    def close(self) -> None:
        """Close every thread's connection; call it once the other threads are done with the store."""
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        with self._writing:
            if self._inline is not None:
                conns.append(self._inline)
                self._inline = None
        for conn in conns:
            conn.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (sqlite3.IntegrityError, sqlite3.DataError) as e:
            raise StoreRefused(f"SQLite store {self.path}: {e}") from e
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"SQLite store {self.path}: {e}") from e

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; IMMEDIATE takes the write lock up front so busy_timeout applies to it."""
        with self._errors(), self._writing:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"SQLite store {self.path} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            with self._lock:
                self._close_dead_threads_connections()
                self._conns[threading.current_thread()] = conn
            self._local.conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        create_private(self.path)
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (a persistent setting) unless another connection already did.

        The switch needs an exclusive lock and SQLite reports a conflict at once instead of
        calling the busy handler, so this waits by itself, as long as busy_timeout would.
        """
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if e.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if mode != "wal":
            raise StoreError(f"SQLite store {self.path}: cannot enable WAL (journal_mode is {mode})")

    def _close_dead_threads_connections(self) -> None:
        for thread in [t for t in self._conns if not t.is_alive()]:
            self._conns.pop(thread).close()


def create_private(path: Path) -> None:
    """The database file as only chatgate's user may read it (0600; SQLite gives its -wal and -shm files the
    same mode), in a directory of its own (0700) where chatgate makes it: it holds every team's usage and
    the refused requests' bodies (issue 48). An existing file or directory is left as it is."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
