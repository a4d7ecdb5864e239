"""PostgreSQL store on a small psycopg connection pool.

The pool checks each connection before handing it out and reconnects in the
background, so after a server restart (or a killed backend) the store recovers
without help; while the server is away every call raises StoreError.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

import orjson
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

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
    USAGE_COLUMNS,
    Queries,
    apply_migrations,
    file_id_chunks,
    file_owner_params,
    key_from_row,
    limit_from_row,
    limit_params,
    report_rows,
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

_Q = Queries.with_placeholder("%s")


# One statement per batch, the records as one JSON array unpacked by PostgreSQL (see sqlite.py).
INSERT_USAGE_JSON = (
    f"INSERT INTO usage ({', '.join(USAGE_COLUMNS)}) SELECT "
    + ", ".join("to_char(to_timestamp(r.ts) AT TIME ZONE 'UTC', 'YYYY-MM-DD')" if c == "day" else f"r.{c}"
                for c in USAGE_COLUMNS)
    + " FROM json_populate_recordset(NULL::usage, %s::json) AS r ON CONFLICT (record_id) DO NOTHING"
)
_MIGRATION_LOCK = 0x6368_6174_6761_7465  # "chatgate": one advisory lock for every replica's migrate()

# Store.reserve and Store.settle as functions on the server: one round trip each instead of one per
# statement (a reservation is on every limited request's path). Each statement of a VOLATILE PL/pgSQL
# function takes a fresh snapshot, so the sum of holds read after a ledger row is locked sees every hold
# committed before the lock was granted: the same guarantee as reserve_in/settle_in in one transaction.
# Replaced (not versioned) by every migrate(); the name carries a number for incompatible changes.
BUDGET_FUNCTIONS = (
    # A period's ledger row, locked; with `seed`, created first if missing (the period's first reservation:
    # it starts from the usage table); NULL if missing without. A flush of a lease never seeds (renew_in).
    """CREATE OR REPLACE FUNCTION chatgate_ledger_1(scope_ text, subject_ text, start_ float8, seed boolean)
        RETURNS int8 LANGUAGE plpgsql AS $$
    DECLARE
        spent int8;
    BEGIN
        SELECT spent_picousd INTO spent FROM budget_ledger
            WHERE scope = scope_ AND subject = subject_ AND period_start = start_ FOR UPDATE;
        IF NOT FOUND AND seed THEN
            IF scope_ = 'team' THEN
                INSERT INTO budget_ledger (scope, subject, period_start, spent_picousd)
                    SELECT scope_, subject_, start_, coalesce(sum(cost_picousd), 0) FROM usage
                    WHERE team = subject_ AND ts >= start_ AND currency = coalesce((SELECT budget_currency
                        FROM limits WHERE limits.scope = scope_ AND limits.subject = subject_), 'USD')
                    ON CONFLICT (scope, subject, period_start) DO NOTHING;
            ELSE
                INSERT INTO budget_ledger (scope, subject, period_start, spent_picousd)
                    SELECT scope_, subject_, start_, coalesce(sum(cost_picousd), 0) FROM usage
                    WHERE key_id = subject_ AND ts >= start_ AND currency = coalesce((SELECT budget_currency
                        FROM limits WHERE limits.scope = scope_ AND limits.subject = subject_), 'USD')
                    ON CONFLICT (scope, subject, period_start) DO NOTHING;
            END IF;
            SELECT spent_picousd INTO spent FROM budget_ledger
                WHERE scope = scope_ AND subject = subject_ AND period_start = start_ FOR UPDATE;
        END IF;
        RETURN spent;
    END $$""",
    """CREATE OR REPLACE FUNCTION chatgate_reserve_1(
        hold_ids text[], scopes text[], subjects text[], starts float8[], amounts int8[], budgets int8[],
        expires float8[], now_ts float8) RETURNS integer LANGUAGE plpgsql AS $$
    DECLARE
        spent int8;
        held int8;
    BEGIN
        -- the holds come sorted by (scope, subject): ledger rows are locked in one order on every replica
        FOR i IN 1 .. coalesce(array_length(hold_ids, 1), 0) LOOP
            spent := chatgate_ledger_1(scopes[i], subjects[i], starts[i], true);
            SELECT coalesce(sum(amount_picousd), 0) INTO held FROM budget_holds
                WHERE scope = scopes[i] AND subject = subjects[i] AND period_start = starts[i]
                  AND expires_at > now_ts;
            IF spent + held + amounts[i] > budgets[i] THEN
                RETURN i;  -- refused: nothing is held (a seeded ledger row stays: it is right either way)
            END IF;
        END LOOP;
        INSERT INTO budget_holds (hold_id, scope, subject, period_start, amount_picousd, expires_at)
            SELECT * FROM unnest(hold_ids, scopes, subjects, starts, amounts, expires);
        RETURN 0;
    END $$""",
    """CREATE OR REPLACE FUNCTION chatgate_settle_1(
        hold_ids text[], scopes text[], subjects text[], starts float8[], amount int8)
        RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM budget_holds WHERE hold_id = ANY(hold_ids);
        FOR i IN 1 .. coalesce(array_length(hold_ids, 1), 0) LOOP  -- sorted as in chatgate_reserve_1
            UPDATE budget_ledger SET spent_picousd = spent_picousd + amount
                WHERE scope = scopes[i] AND subject = subjects[i] AND period_start = starts[i];
        END LOOP;
    END $$""",
    """CREATE OR REPLACE FUNCTION chatgate_lease_2(
        hold_ids text[], scopes text[], subjects text[], starts float8[], budgets int8[], spents int8[],
        flusheds int8[], keeps int8[], needs int8[], extras int8[], expires float8[], now_ts float8)
        RETURNS int8[] LANGUAGE plpgsql AS $$
    DECLARE
        n integer := coalesce(array_length(hold_ids, 1), 0);
        ledger int8;
        prior int8;
        spent int8[] := array_fill(0::int8, ARRAY[n]);
        free int8[] := array_fill(0::int8, ARRAY[n]);
        added int8[] := array_fill(0::int8, ARRAY[n]);
        total int8[] := array_fill(0::int8, ARRAY[n]);
        held int8;
        refused integer := 0;
        amount int8;
        out int8[];
    BEGIN
        -- the asks come sorted by (scope, subject), as the holds of chatgate_reserve_1
        FOR i IN 1 .. n LOOP
            ledger := chatgate_ledger_1(scopes[i], subjects[i], starts[i], needs[i] > keeps[i]);
            -- what the ledger has of this lease's spend: a renewal whose answer was lost was applied
            SELECT flushed_picousd INTO prior FROM budget_holds WHERE hold_id = hold_ids[i] FOR UPDATE;
            total[i] := greatest(flusheds[i] + spents[i], coalesce(prior, 0));
            added[i] := total[i] - coalesce(prior, 0);
            spent[i] := coalesce(ledger, 0) + added[i];
            IF needs[i] > keeps[i] OR extras[i] > 0 THEN  -- else nothing depends on it
                SELECT coalesce(sum(amount_picousd), 0) INTO held FROM budget_holds
                    WHERE scope = scopes[i] AND subject = subjects[i] AND period_start = starts[i]
                      AND expires_at > now_ts AND hold_id <> hold_ids[i];
                free[i] := budgets[i] - spent[i] - held;
            END IF;
            IF needs[i] > keeps[i] AND free[i] < needs[i] AND refused = 0 THEN
                refused := i;
            END IF;
        END LOOP;
        out := ARRAY[refused::int8];
        FOR i IN 1 .. n LOOP
            IF refused > 0 THEN
                amount := keeps[i];
            ELSE
                amount := needs[i] + greatest(least(extras[i], (free[i] - needs[i]) / 4), 0);
            END IF;
            IF added[i] <> 0 THEN
                UPDATE budget_ledger SET spent_picousd = spent_picousd + added[i]
                    WHERE scope = scopes[i] AND subject = subjects[i] AND period_start = starts[i];
            END IF;
            IF amount > 0 OR total[i] > 0 THEN  -- in place (see Queries.upsert_lease); given back: at 0
                INSERT INTO budget_holds (hold_id, scope, subject, period_start, amount_picousd, expires_at,
                                          flushed_picousd)
                    VALUES (hold_ids[i], scopes[i], subjects[i], starts[i], amount, expires[i], total[i])
                    ON CONFLICT (hold_id) DO UPDATE
                    SET amount_picousd = excluded.amount_picousd, expires_at = excluded.expires_at,
                        flushed_picousd = excluded.flushed_picousd;
            ELSE
                DELETE FROM budget_holds WHERE hold_id = hold_ids[i];
            END IF;
            out := out || amount || spent[i];
        END LOOP;
        RETURN out;
    END $$""",
)
RESERVE = ("SELECT chatgate_reserve_1(%s::text[], %s::text[], %s::text[], %s::float8[], %s::int8[], "
           "%s::int8[], %s::float8[], %s::float8)")
SETTLE = "SELECT chatgate_settle_1(%s::text[], %s::text[], %s::text[], %s::float8[], %s::int8)"
LEASE = ("SELECT chatgate_lease_2(%s::text[], %s::text[], %s::text[], %s::float8[], %s::int8[], %s::int8[], "
         "%s::int8[], %s::int8[], %s::int8[], %s::int8[], %s::float8[], %s::float8)")

_Connection = psycopg.Connection[TupleRow]
CHECK_AFTER = 1.0  # seconds since a connection last answered before the pool checks it again


class PostgresStore:
    server = True
    def __init__(
        self,
        url: str,
        *,
        max_size: int = 4,
        timeout: float = 5.0,
        insert_timeout: float = 15.0,
        slow_timeout: float = 300.0,
    ) -> None:
        """Deadlines, in seconds: `timeout` to get a connection and for the quick calls (ping,
        keys); `insert_timeout` for an insert_usage batch; `slow_timeout` for reports and migrate()."""
        self.url = url
        self._timeout = timeout
        self._insert_timeout = insert_timeout
        self._slow_timeout = slow_timeout
        self._watchdog = _Watchdog()
        # a connection -> when its last call succeeded (kept while the pool keeps the connection)
        self._answered: weakref.WeakKeyDictionary[_Connection, float] = weakref.WeakKeyDictionary()
        self._pool: ConnectionPool[_Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=timeout,
            # Give up a reconnection attempt as soon as a caller would, so the next call starts a
            # fresh attempt instead of waiting out an exponential backoff.
            reconnect_timeout=timeout,
            check=self._check,
            kwargs={"autocommit": True, "connect_timeout": max(2, round(timeout))},
            name="chatgate-store",
        )
        self._pool.open(wait=False)

    def migrate(self) -> None:
        with self._connection(self._slow_timeout) as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            apply_migrations(cur, _Q)
            for statement in BUDGET_FUNCTIONS:
                cur.execute(statement)

    def schema_version(self) -> int:
        """The applied schema version, 0 before the first migrate()."""
        with self._connection(self._timeout) as conn:
            row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
            if row is None or not row[0]:
                return 0
            row = conn.execute(CURRENT_VERSION).fetchone()
        return 0 if row is None else int(row[0])

    def ping(self) -> None:
        with self._connection(self._timeout) as conn:
            row = conn.execute("SELECT current_setting('transaction_read_only')").fetchone()
        if row is None or row[0] != "off":
            raise StoreError("PostgreSQL store: the server is read-only")

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        self.insert_batch(records, ())

    def insert_batch(self, records: Sequence[UsageRecord], turns: Sequence[TurnRow]) -> None:
        if not records and not turns:
            return
        with self._connection(self._insert_timeout) as conn, conn.transaction(), conn.cursor() as cur:
            if records:
                cur.execute(INSERT_USAGE_JSON, (orjson.dumps(list(records)).decode(),))
            if turns:
                cur.executemany(_Q.remember_turn, [turn_params(r) for r in turns])

    def usage_report(self, query: ReportQuery) -> list[ReportRow]:
        sql, params = _Q.report(query)
        with self._connection(self._slow_timeout) as conn:
            rows = conn.execute(sql, params).fetchall()
        return report_rows(query.group_by, rows)

    def latencies(self, query: ReportQuery, limit: int) -> list[tuple[str, float]]:
        sql, params = _Q.latencies(query, limit)
        with self._connection(self._slow_timeout) as conn:
            return [(str(model), float(ms)) for model, ms in conn.execute(sql, params).fetchall()]

    def create_key(self, key_id: str, key_hash: str, prefix: str, team: str, name: str) -> ApiKey:
        created_at = time.time()
        with self._connection(self._timeout) as conn:
            conn.execute(_Q.insert_key, (key_id, key_hash, prefix, team, name, created_at))
        return ApiKey(key_id=key_id, name=name, team=team, prefix=prefix, created_at=created_at)

    def list_keys(self) -> list[ApiKey]:
        with self._connection(self._timeout) as conn:
            return [key_from_row(row) for row in conn.execute(_Q.list_keys)]

    def revoke_key(self, key_id: str) -> bool:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.revoke_key, (time.time(), key_id)).rowcount == 1

    def find_key(self, key_hash: str) -> ApiKey | None:
        with self._connection(self._timeout) as conn:
            row = conn.execute(_Q.find_key, (key_hash,)).fetchone()
        return None if row is None else key_from_row(row)

    def try_remember_turns(self, rows: Sequence[TurnRow]) -> bool:
        return False  # a round trip: never on the event loop

    def remember_turns(self, rows: Sequence[TurnRow]) -> None:
        if rows:
            with self._connection(self._timeout) as conn, conn.transaction(), conn.cursor() as cur:
                cur.executemany(_Q.remember_turn, [turn_params(r) for r in rows])

    def recall_turns(self, caller: str, kind: str, call_ids: Sequence[str], now: float) -> list[TurnRow]:
        if not call_ids:
            return []
        with self._connection(self._timeout) as conn:
            rows = conn.execute(_Q.recall_turns(len(call_ids)), (caller, kind, now, *call_ids)).fetchall()
        return [TurnRow(*row) for row in rows]

    def purge_turns(self, now: float) -> int:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.purge_turns, (now,)).rowcount

    # --- the owners of uploaded files ---

    def own_file(self, owner: FileOwner) -> bool:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.own_file, file_owner_params(owner)).rowcount == 1

    def file_owner(self, file_id: str) -> FileOwner | None:
        with self._connection(self._timeout) as conn:
            row = conn.execute(_Q.file_owner, (file_id,)).fetchone()
        return None if row is None else FileOwner(*row)

    def files_owned(self, team: str, file_ids: Sequence[str]) -> set[str]:
        owned: set[str] = set()
        with self._connection(self._timeout) as conn:
            for chunk in file_id_chunks(file_ids):
                owned.update(row[0] for row in conn.execute(_Q.files_owned(len(chunk)), (team, *chunk)))
        return owned

    def file_tokens(self, file_ids: Sequence[str]) -> dict[str, int | None]:
        found: dict[str, int | None] = {}
        with self._connection(self._timeout) as conn:
            for chunk in file_id_chunks(file_ids):
                rows = conn.execute(_Q.file_tokens(len(chunk)), tuple(chunk))
                found.update((row[0], row[1]) for row in rows)
        return found

    def disown_file(self, file_id: str) -> bool:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.disown_file, (file_id,)).rowcount == 1

    # --- limits and budgets ---

    def get_limits(self, scope: str, subject: str) -> LimitRow | None:
        with self._connection(self._timeout) as conn:
            row = conn.execute(_Q.get_limits, (scope, subject)).fetchone()
        return None if row is None else limit_from_row(row)

    def list_limits(self, scope: str) -> list[LimitRow]:
        with self._connection(self._timeout) as conn:
            return [limit_from_row(row) for row in conn.execute(_Q.list_limits, (scope,))]

    def set_limits(self, row: LimitRow) -> None:
        with self._connection(self._timeout) as conn:
            if row.empty:
                conn.execute(_Q.delete_limits, (row.scope, row.subject))
            else:
                conn.execute(_Q.upsert_limits, limit_params(row))
            if row.budget_picousd is None:
                conn.execute(_Q.drop_ledger, (row.scope, row.subject))

    def spend(self, scope: str, subject: str, since: float, currency: str | None = None) -> int:
        with self._connection(self._slow_timeout) as conn:
            row = conn.execute(_Q.spend(scope), (subject, since, currency)).fetchone()
        return 0 if row is None else int(row[0])

    def reserve(self, holds: Sequence[Hold], now: float) -> Hold | None:
        """One statement (chatgate_reserve_1); the ledger rows are locked (SELECT … FOR UPDATE) in a fixed
        order."""
        ordered = sorted(holds, key=lambda h: (h.scope, h.subject))
        params = (*_hold_columns(ordered), [h.amount_picousd for h in ordered],
                  [h.budget_picousd for h in ordered], [h.expires_at for h in ordered], now)
        with self._connection(self._timeout) as conn:
            row = conn.execute(RESERVE, params).fetchone()
        refused = int(row[0]) if row is not None else 0
        return ordered[refused - 1] if refused else None

    def settle(self, holds: Sequence[Hold], amount_picousd: int) -> None:
        ordered = sorted(holds, key=lambda h: (h.scope, h.subject))
        with self._connection(self._timeout) as conn:
            conn.execute(SETTLE, (*_hold_columns(ordered), amount_picousd))

    def renew_leases(self, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
        """One statement (chatgate_lease_2), the ledger rows locked in the order of chatgate_reserve_1."""
        order = sorted(range(len(asks)), key=lambda i: (asks[i].scope, asks[i].subject))
        o = [asks[i] for i in order]
        params = (*_hold_columns(o), [a.budget_picousd for a in o], [a.spent_picousd for a in o],
                  [a.flushed_picousd for a in o], [a.keep_picousd for a in o], [a.need_picousd for a in o],
                  [a.extra_picousd for a in o], [a.expires_at for a in o], now)
        with self._connection(self._timeout) as conn:
            row = conn.execute(LEASE, params).fetchone()
        assert row is not None
        values = [int(v) for v in row[0]]
        grants: list[LeaseGrant] = [LeaseGrant(0, 0)] * len(asks)
        for n, i in enumerate(order):
            grants[i] = LeaseGrant(values[1 + 2 * n], values[2 + 2 * n])
        return (order[values[0] - 1] + 1 if values[0] else 0), grants

    def budget_state(self, scope: str, subject: str, period_start: float, now: float) -> tuple[int, int]:
        with self._connection(self._timeout) as conn:
            row = conn.execute(_Q.ledger_spent, (scope, subject, period_start)).fetchone()
            held_row = conn.execute(_Q.held, (scope, subject, period_start, now)).fetchone()
        spent = int(row[0]) if row is not None else self.spend(scope, subject, period_start)
        return spent, int(held_row[0]) if held_row is not None else 0

    def purge_holds(self, now: float) -> int:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.purge_holds, (now,)).rowcount

    def mark_alert(self, scope: str, subject: str, period_start: float, level: str, now: float) -> bool:
        with self._connection(self._timeout) as conn:
            return conn.execute(_Q.mark_alert, (scope, subject, period_start, level, now)).rowcount == 1

    def run_records(self, since: float, until: float | None, team: str | None, key_id: str | None,
                    keys: Sequence[str] | None = None) -> list[RunRecord]:
        with self._connection(self._slow_timeout) as conn, conn.cursor() as cur:
            return records_in(cur, "%s", since, until, team, key_id, keys)

    def named_run(self, run_id: str) -> list[RunRecord]:
        with self._connection(self._slow_timeout) as conn, conn.cursor() as cur:
            return named_in(cur, "%s", run_id)

    def run_head(self, run_id: str) -> RunHead | None:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return head_in(cur, "%s", run_id)

    def run_of_thread(self, thread: str) -> RunHead | None:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return thread_in(cur, "%s", thread)

    def recent_runs(self, since: float, limit: int) -> list[RunHead]:
        with self._connection(self._slow_timeout) as conn, conn.cursor() as cur:
            return recent_in(cur, "%s", since, limit)

    # --- the rules' evidence (issue 47) ---

    def rule_evidence(self, keys: Sequence[tuple[str, str, str]] | None = None, since: float | None = None
                      ) -> list[RuleEvidence]:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return select_evidence(cur, "%s", keys, since)

    def record_evidence(self, events: Sequence[EvidenceEvent], now: float) -> list[RuleEvidence]:
        with self._connection(self._timeout) as conn, conn.transaction(), conn.cursor() as cur:
            return [apply_event(cur, "%s", e, now) for e in events]

    def reset_evidence(self, rule: str, family: str | None = None) -> int:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return reset(cur, "%s", rule, family)

    def take_rule_lease(self, key: tuple[str, str, str], holder: str, now: float, expires_at: float) -> bool:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return take_lease(cur, "%s", key, holder, now, expires_at)

    def release_rule_lease(self, key: tuple[str, str, str], holder: str) -> None:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            release_lease(cur, "%s", key, holder)

    def record_unpredicted(self, family: str, model: str, message: str, request_id: str, now: float) -> None:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            add_unpredicted(cur, "%s", family, model, message, request_id, now)

    def unpredicted(self, since: float | None = None, limit: int = 100) -> list[Unpredicted]:
        with self._connection(self._timeout) as conn, conn.cursor() as cur:
            return select_unpredicted(cur, "%s", since, limit)

    def close(self) -> None:
        self._pool.close()
        self._watchdog.close()

    @contextmanager
    def _connection(self, deadline: float) -> Iterator[_Connection]:
        """A pooled autocommit connection, cut after `deadline` seconds; failures become StoreError."""
        try:
            with self._pool.connection() as conn, self._watchdog.guard(conn, deadline):
                yield conn
                self._answered[conn] = time.monotonic()
        except PoolTimeout as e:
            raise StoreError(f"PostgreSQL store: {e}{self._why_no_connection()}") from e
        except (psycopg.DataError, psycopg.IntegrityError) as e:
            raise StoreRefused(f"PostgreSQL store: {_message(e)}") from e
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL store: {_message(e)}") from e

    def _check(self, conn: _Connection) -> None:
        """Run by the pool before handing out a connection: one that was killed is replaced. A connection
        that answered within the last second is only looked at, not asked (a round trip costs as much
        as a whole reservation): an idle connection has nothing to read unless the server closed it (a
        killed backend, a restart) or sent its last words before doing so."""
        if time.monotonic() - self._answered.get(conn, -CHECK_AFTER) < CHECK_AFTER:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
            if not poller.poll(0):
                return
            # Something to read: most often the server's last words, but a new connection can have
            # something pending too (and may carry a discarded one's id): the round trip decides.
        with self._watchdog.guard(conn, self._timeout):
            conn.execute("")

    def _why_no_connection(self) -> str:
        """The pool only logs why it cannot connect, so ask the server once ourselves."""
        try:
            psycopg.connect(self.url, connect_timeout=2).close()
        except psycopg.Error as e:
            return f" ({_message(e)})"
        return ""


class _Watchdog:
    """Cuts the socket of a connection whose call overran its deadline.

    psycopg has no client-side deadline for a query: on a dead network path (nothing
    answers, no reset) a call would block its thread forever. Shutting the socket
    down makes libpq fail at once, and the pool then drops the broken connection.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: dict[object, tuple[float, _Connection]] = {}
        self._cut: set[object] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def guard(self, conn: _Connection, seconds: float) -> Iterator[None]:
        token = object()
        with self._cond:
            self._deadlines[token] = (time.monotonic() + seconds, conn)
            self._start()
            self._cond.notify()
        try:
            yield
        except psycopg.Error as e:
            if token in self._cut:
                raise StoreError(f"PostgreSQL store: no answer within {seconds:g} s, connection cut") from e
            raise
        finally:
            with self._cond:
                self._deadlines.pop(token, None)
                self._cut.discard(token)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chatgate-store-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for token, (deadline, conn) in list(self._deadlines.items()):
                    if deadline <= now:
                        # Under the lock the guarded call has not returned, so conn's socket is still its own.
                        del self._deadlines[token]
                        self._cut.add(token)
                        _shut_down(conn)
                wake = min((deadline for deadline, _ in self._deadlines.values()), default=None)
                self._cond.wait(None if wake is None else wake - now)


def _shut_down(conn: _Connection) -> None:
    with suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _message(e: psycopg.Error) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _hold_columns(holds: Sequence[Hold] | Sequence[LeaseAsk]
                  ) -> tuple[list[str], list[str], list[str], list[float]]:
    return ([h.hold_id for h in holds], [h.scope for h in holds], [h.subject for h in holds],
            [h.period_start for h in holds])
