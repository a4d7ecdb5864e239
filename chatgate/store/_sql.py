"""SQL shared by the SQLite and PostgreSQL stores.

Everything here is accepted by both dialects; only the parameter placeholder
differs (`?` for sqlite3, `%s` for psycopg).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatgate.store.base import (
    COUNTERS,
    GROUP_BYS,
    ApiKey,
    FileOwner,
    GroupBy,
    Hold,
    LeaseAsk,
    LeaseGrant,
    LimitRow,
    ReportQuery,
    ReportRow,
    TurnRow,
)

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
    # 4: budgets and limits (issue 15): limits per team and key, the spend ledger per budget period, the
    # reservations of requests in flight, the alerts already sent.
    (
        """CREATE TABLE limits (
            scope TEXT NOT NULL,
            subject TEXT NOT NULL,
            budget_picousd BIGINT,
            budget_period TEXT,
            rpm BIGINT,
            tpm BIGINT,
            max_concurrent BIGINT,
            updated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (scope, subject)
        )""",
        """CREATE TABLE budget_ledger (
            scope TEXT NOT NULL,
            subject TEXT NOT NULL,
            period_start DOUBLE PRECISION NOT NULL,
            spent_picousd BIGINT NOT NULL,
            PRIMARY KEY (scope, subject, period_start)
        )""",
        """CREATE TABLE budget_holds (
            hold_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            subject TEXT NOT NULL,
            period_start DOUBLE PRECISION NOT NULL,
            amount_picousd BIGINT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX budget_holds_ledger ON budget_holds (scope, subject, period_start)",
        """CREATE TABLE alerts_sent (
            scope TEXT NOT NULL,
            subject TEXT NOT NULL,
            period_start DOUBLE PRECISION NOT NULL,
            level TEXT NOT NULL,
            sent_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (scope, subject, period_start, level)
        )""",
    ),
    # 5: the Files API in managed mode: which team (and key) uploaded each file, since DeepSeek sees one key.
    (
        """CREATE TABLE file_owners (
            file_id TEXT PRIMARY KEY,
            team TEXT NOT NULL,
            key_id TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        )""",
    ),
    # 6: a lease's hold keeps the spend settled under it that the ledger has, so that a renewal applied
    # whose answer was lost, tried again, adds only what is new (no spend counted twice).
    ("ALTER TABLE budget_holds ADD COLUMN flushed_picousd BIGINT NOT NULL DEFAULT 0",),
    # 7: a request of a model without a price is flagged, so that its cost 0 is never taken for a price.
    ("ALTER TABLE usage ADD COLUMN unpriced BOOLEAN NOT NULL DEFAULT FALSE",),
    # 8: retries (issue 35): the attempts a request took, and the DeepSeek account that answered it.
    (
        "ALTER TABLE usage ADD COLUMN attempts BIGINT NOT NULL DEFAULT 1",
        "ALTER TABLE usage ADD COLUMN account TEXT",
    ),
    # 9: the context cache (issue 37): what each request's hits saved, and its prefix break if it had one.
    (
        "ALTER TABLE usage ADD COLUMN cache_saved_picousd BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE usage ADD COLUMN cache_break TEXT",
        "ALTER TABLE usage ADD COLUMN cache_lost_tokens BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE usage ADD COLUMN cache_lost_picousd BIGINT NOT NULL DEFAULT 0",
    ),
    # 10: non-token charges (issue 46): the tool APIs' billed units and a model's web searches and fetches.
    (
        "ALTER TABLE usage ADD COLUMN billed_units BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE usage ADD COLUMN billed_unit TEXT",
        "ALTER TABLE usage ADD COLUMN billed_estimated BOOLEAN NOT NULL DEFAULT FALSE",
        "ALTER TABLE usage ADD COLUMN billed_picousd BIGINT NOT NULL DEFAULT 0",
    ),
    # 11: what DeepSeek bills for an uploaded document in a request (issue 48): counted once, at upload;
    # NULL where it cannot be known (a file that is not text).
    ("ALTER TABLE file_owners ADD COLUMN tokens BIGINT",),
    # 12: yuan (issue 46): the currency of each record's costs (its *_picousd columns hold pico-units of
    # it) and of each budget; the rows before were all USD.
    (
        "ALTER TABLE usage ADD COLUMN currency TEXT NOT NULL DEFAULT 'USD'",
        "ALTER TABLE limits ADD COLUMN budget_currency TEXT NOT NULL DEFAULT 'USD'",
    ),
    # 13: agent runs (issue 52): each run, its counters and its requests; the bounds on a run.
    (
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL,
            key_name TEXT NOT NULL,
            team TEXT NOT NULL,
            source TEXT NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            last_seen DOUBLE PRECISION NOT NULL,
            stopped TEXT,
            thread TEXT,
            requests BIGINT NOT NULL,
            turns BIGINT NOT NULL,
            cost_picousd BIGINT NOT NULL,
            streak BIGINT NOT NULL
        )""",
        "CREATE INDEX runs_thread ON runs (thread)",
        """CREATE TABLE run_rounds (
            run_id TEXT NOT NULL,
            ts DOUBLE PRECISION NOT NULL,
            rounds TEXT NOT NULL
        )""",
        "CREATE INDEX run_rounds_run ON run_rounds (run_id)",
        "ALTER TABLE limits ADD COLUMN run_max_turns BIGINT",
        "ALTER TABLE limits ADD COLUMN run_max_cost_picousd BIGINT",
        "ALTER TABLE limits ADD COLUMN run_max_repeats BIGINT",
    ),
    # 14: rules that keep themselves true (issue 47): what DeepSeek answered requests a rule refused or
    # warned about, per rule, family and model; the one confirmation in flight per rule, family and model
    # (a lease); and the refusals of DeepSeek no rule predicted, grouped by their masked message.
    (
        """CREATE TABLE rule_evidence (
            rule TEXT NOT NULL,
            family TEXT NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            confirmed BIGINT NOT NULL DEFAULT 0,
            disputed BIGINT NOT NULL DEFAULT 0,
            warned BIGINT NOT NULL DEFAULT 0,
            refused BIGINT NOT NULL DEFAULT 0,
            accepted BIGINT NOT NULL DEFAULT 0,
            last_confirmed DOUBLE PRECISION,
            last_disputed DOUBLE PRECISION,
            example_request_id TEXT,
            updated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (rule, family, model)
        )""",
        """CREATE TABLE rule_leases (
            rule TEXT NOT NULL,
            family TEXT NOT NULL,
            model TEXT NOT NULL,
            holder TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (rule, family, model)
        )""",
        """CREATE TABLE unpredicted_refusals (
            family TEXT NOT NULL,
            model TEXT NOT NULL,
            message TEXT NOT NULL,
            count BIGINT NOT NULL,
            first_seen DOUBLE PRECISION NOT NULL,
            last_seen DOUBLE PRECISION NOT NULL,
            example_request_ids TEXT NOT NULL,
            PRIMARY KEY (family, model, message)
        )""",
    ),
    # 15: a run is the usage records that carry its id (chatgate/store/runs.py): its requests' run, their
    # history's print and their part in the run ride on the records, written with them; migration 13's
    # tables (never in a release) are dropped.
    (
        "ALTER TABLE usage ADD COLUMN run_id TEXT",
        "ALTER TABLE usage ADD COLUMN run_thread TEXT",
        "ALTER TABLE usage ADD COLUMN run_detail TEXT",
        "CREATE INDEX usage_run ON usage (run_id) WHERE run_id IS NOT NULL",
        "CREATE INDEX usage_run_thread ON usage (run_thread) WHERE run_thread IS NOT NULL",
        "DROP TABLE run_rounds",
        "DROP TABLE runs",
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
    "unpriced",
    "attempts",
    "account",
    "cache_saved_picousd",
    "cache_break",
    "cache_lost_tokens",
    "cache_lost_picousd",
    "billed_units",
    "billed_unit",
    "billed_estimated",
    "billed_picousd",
    "currency",
    "run_id",
    "run_thread",
    "run_detail",
)
FILE_OWNER_COLUMNS = ("file_id", "team", "key_id", "created_at", "tokens")
FILE_IDS_PER_QUERY = 500  # below every SQLite's limit on a statement's parameters (999 before 3.32)
_KEY_SELECT = "SELECT key_id, name, team, prefix, created_at, revoked_at FROM api_keys"
LIMIT_COLUMNS = ("scope", "subject", "budget_picousd", "budget_period", "rpm", "tpm", "max_concurrent",
                 "updated_at", "budget_currency", "run_max_turns", "run_max_cost_picousd", "run_max_repeats")

_GROUP_FIELDS: dict[GroupBy, tuple[tuple[str, str], ...]] = {
    "key": (("key_id", "key_id"), ("key_name", "max(key_name)"), ("team", "max(team)")),
    "team": (("team", "team"),),
    "model": (("model", "model"),),
    "day": (("day", "day"),),
    "rule": (("rule_code", "coalesce(rule_code, '')"),),  # '' for requests that were not rejected
    # one row per combination of repairs; `report_rows` splits them into one row per repair code
    "repair": (("repairs", "coalesce(repairs, '')"),),
    "account": (("account", "coalesce(account, '')"),),  # '' for passthrough and unanswered requests
    # the cache report's breaks: one row per group and break path, with one request that had it
    "break_key": (("key_id", "key_id"), ("cache_break", "cache_break"), ("key_name", "max(key_name)"),
                  ("team", "max(team)"), ("example_request_id", "max(request_id)")),
    "break_team": (("team", "team"), ("cache_break", "cache_break"),
                   ("example_request_id", "max(request_id)")),
    "break_model": (("model", "model"), ("cache_break", "cache_break"),
                    ("example_request_id", "max(request_id)")),
}
# DeepSeek's answer was a 4xx (a record's upstream_status is DeepSeek's status; chatgate's own answer may
# differ: a 401 to chatgate's key in managed mode is a 502 to the client); any other upstream_error is a 5xx
# after the retries, or a stream that ended with DeepSeek's error event (upstream_status 200)
_UPSTREAM_4XX = ("outcome = 'upstream_error' AND upstream_status IS NOT NULL AND upstream_status >= 400 "
                 "AND upstream_status < 500")
_COUNTER_SQL = {
    "requests": "count(*)",
    "rejected": "sum(CASE WHEN outcome = 'rejected' THEN 1 ELSE 0 END)",
    "limited": "sum(CASE WHEN outcome = 'limited' THEN 1 ELSE 0 END)",
    "upstream_refused": f"sum(CASE WHEN {_UPSTREAM_4XX} THEN 1 ELSE 0 END)",
    "upstream_failed": f"sum(CASE WHEN outcome = 'upstream_failed' OR (outcome = 'upstream_error' AND NOT "
                       f"({_UPSTREAM_4XX})) THEN 1 ELSE 0 END)",
    "prompt_tokens": "sum(prompt_tokens)",
    "completion_tokens": "sum(completion_tokens)",
    "prompt_cache_hit_tokens": "sum(prompt_cache_hit_tokens)",
    "prompt_cache_miss_tokens": "sum(prompt_cache_miss_tokens)",
    "reasoning_tokens": "sum(reasoning_tokens)",
    "cost_picousd": "sum(CASE WHEN currency = 'CNY' THEN 0 ELSE cost_picousd END)",
    "cost_picocny": "sum(CASE WHEN currency = 'CNY' THEN cost_picousd ELSE 0 END)",
    "estimated_requests": "sum(CASE WHEN tokens_exact THEN 0 ELSE 1 END)",
    "unpriced_requests": "sum(CASE WHEN unpriced THEN 1 ELSE 0 END)",
    "cache_saved_picousd": "sum(CASE WHEN currency = 'CNY' THEN 0 ELSE cache_saved_picousd END)",
    "cache_saved_picocny": "sum(CASE WHEN currency = 'CNY' THEN cache_saved_picousd ELSE 0 END)",
    "cache_breaks": "sum(CASE WHEN cache_break IS NULL THEN 0 ELSE 1 END)",
    "cache_lost_tokens": "sum(cache_lost_tokens)",
    "cache_lost_picousd": "sum(CASE WHEN currency = 'CNY' THEN 0 ELSE cache_lost_picousd END)",
    "cache_lost_picocny": "sum(CASE WHEN currency = 'CNY' THEN cache_lost_picousd ELSE 0 END)",
    "billed_calls": "sum(CASE WHEN billed_unit = 'call' THEN billed_units ELSE 0 END)",
    "billed_pages": "sum(CASE WHEN billed_unit = 'page' THEN billed_units ELSE 0 END)",
    "billed_characters": "sum(CASE WHEN billed_unit = 'character' THEN billed_units ELSE 0 END)",
    "billed_picousd": "sum(CASE WHEN currency = 'CNY' THEN 0 ELSE billed_picousd END)",
    "billed_picocny": "sum(CASE WHEN currency = 'CNY' THEN billed_picousd ELSE 0 END)",
    "billed_estimated_requests": "sum(CASE WHEN billed_estimated THEN 1 ELSE 0 END)",
}
# the currency of a subject's budget, in a statement over its usage records
_BUDGET_CURRENCY = ("coalesce((SELECT budget_currency FROM limits WHERE limits.scope = {scope} "
                    "AND limits.subject = usage.{subject}), 'USD')")
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

    # --- limits and budgets (the same SQL for both backends) ---

    @property
    def get_limits(self) -> str:
        p = self.placeholder
        return f"SELECT {', '.join(LIMIT_COLUMNS)} FROM limits WHERE scope = {p} AND subject = {p}"

    @property
    def list_limits(self) -> str:
        columns = ", ".join(LIMIT_COLUMNS)
        return f"SELECT {columns} FROM limits WHERE scope = {self.placeholder} ORDER BY subject"

    @property
    def upsert_limits(self) -> str:
        p = self.placeholder
        updates = ", ".join(f"{c} = excluded.{c}" for c in LIMIT_COLUMNS[2:])
        values = ", ".join([p] * len(LIMIT_COLUMNS))
        return (f"INSERT INTO limits ({', '.join(LIMIT_COLUMNS)}) VALUES ({values}) "
                f"ON CONFLICT (scope, subject) DO UPDATE SET {updates}")

    @property
    def delete_limits(self) -> str:
        return f"DELETE FROM limits WHERE scope = {self.placeholder} AND subject = {self.placeholder}"

    @property
    def drop_ledger(self) -> str:
        """A subject's budget ledger rows: dropped when its budget is cleared, since spending is not tracked
        without a budget; a budget set again starts from the usage table."""
        p = self.placeholder
        return f"DELETE FROM budget_ledger WHERE scope = {p} AND subject = {p}"

    def spend(self, scope: str) -> str:
        """The usage recorded for a team or key since a time, in a currency (NULL: its budget's, USD
        without one; the column depends on the scope)."""
        column, literal = ("team", "'team'") if scope == "team" else ("key_id", "'key'")
        p = self.placeholder
        return (f"SELECT coalesce(sum(cost_picousd), 0) FROM usage WHERE {column} = {p} AND ts >= {p} "
                f"AND currency = coalesce(CAST({p} AS TEXT), "
                f"{_BUDGET_CURRENCY.format(scope=literal, subject=column)[len('coalesce('):]}")

    def seed_ledger(self, scope: str) -> str:
        """A period's ledger row, started from what the usage table already holds for it (its records in
        the budget's currency)."""
        column, literal = ("team", "'team'") if scope == "team" else ("key_id", "'key'")
        p = self.placeholder
        return (f"INSERT INTO budget_ledger (scope, subject, period_start, spent_picousd) "
                f"SELECT {p}, {p}, {p}, coalesce(sum(cost_picousd), 0) FROM usage WHERE {column} = {p} "
                f"AND ts >= {p} AND currency = {_BUDGET_CURRENCY.format(scope=literal, subject=column)} "
                "ON CONFLICT (scope, subject, period_start) DO NOTHING")

    @property
    def ledger_spent(self) -> str:
        p = self.placeholder
        return ("SELECT spent_picousd FROM budget_ledger WHERE scope = "
                f"{p} AND subject = {p} AND period_start = {p}")

    @property
    def held(self) -> str:
        p = self.placeholder
        return ("SELECT coalesce(sum(amount_picousd), 0) FROM budget_holds WHERE scope = "
                f"{p} AND subject = {p} AND period_start = {p} AND expires_at > {p}")

    @property
    def held_by_others(self) -> str:
        p = self.placeholder
        return ("SELECT coalesce(sum(amount_picousd), 0) FROM budget_holds WHERE scope = "
                f"{p} AND subject = {p} AND period_start = {p} AND expires_at > {p} AND hold_id <> {p}")

    @property
    def insert_hold(self) -> str:
        p = self.placeholder
        return ("INSERT INTO budget_holds (hold_id, scope, subject, period_start, amount_picousd, "
                f"expires_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p})")

    @property
    def upsert_lease(self) -> str:
        """A lease's hold replaced in place, with the spend settled under it that the ledger now has: an
        update of columns no index covers, which PostgreSQL does without a new index entry (HOT) and cleans
        up without VACUUM, so leases renewed every few milliseconds leave no dead rows behind."""
        p = self.placeholder
        return ("INSERT INTO budget_holds (hold_id, scope, subject, period_start, amount_picousd, "
                f"expires_at, flushed_picousd) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) "
                "ON CONFLICT (hold_id) DO UPDATE SET amount_picousd = excluded.amount_picousd, "
                "expires_at = excluded.expires_at, flushed_picousd = excluded.flushed_picousd")

    @property
    def lease_flushed(self) -> str:
        return f"SELECT flushed_picousd FROM budget_holds WHERE hold_id = {self.placeholder}"

    @property
    def take_hold(self) -> str:
        return f"DELETE FROM budget_holds WHERE hold_id = {self.placeholder}"

    @property
    def add_spent(self) -> str:
        p = self.placeholder
        return ("UPDATE budget_ledger SET spent_picousd = spent_picousd + "
                f"{p} WHERE scope = {p} AND subject = {p} AND period_start = {p}")

    @property
    def purge_holds(self) -> str:
        return f"DELETE FROM budget_holds WHERE expires_at <= {self.placeholder}"

    @property
    def mark_alert(self) -> str:
        p = self.placeholder
        return ("INSERT INTO alerts_sent (scope, subject, period_start, level, sent_at) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}) ON CONFLICT DO NOTHING")

    # --- the owners of uploaded files (the same SQL for both backends) ---

    @property
    def own_file(self) -> str:
        p = self.placeholder
        return (f"INSERT INTO file_owners ({', '.join(FILE_OWNER_COLUMNS)}) VALUES ({p}, {p}, {p}, {p}, {p}) "
                "ON CONFLICT (file_id) DO NOTHING")

    @property
    def file_owner(self) -> str:
        return f"SELECT {', '.join(FILE_OWNER_COLUMNS)} FROM file_owners WHERE file_id = {self.placeholder}"

    @property
    def disown_file(self) -> str:
        return f"DELETE FROM file_owners WHERE file_id = {self.placeholder}"

    def files_owned(self, count: int) -> str:
        ids = ", ".join([self.placeholder] * count)
        return f"SELECT file_id FROM file_owners WHERE team = {self.placeholder} AND file_id IN ({ids})"

    def file_tokens(self, count: int) -> str:
        ids = ", ".join([self.placeholder] * count)
        return f"SELECT file_id, tokens FROM file_owners WHERE file_id IN ({ids})"

    def remember_turns(self, count: int) -> str:
        """`remember_turn` for `count` rows in one statement (one step: the writer thread lets go of the
        GIL once per batch, not once per row)."""
        return _remember_turns(self.placeholder, count)

    def recall_turns(self, count: int) -> str:
        ids = ", ".join([self.placeholder] * count)
        p = self.placeholder
        return ("SELECT caller, kind, call_id, turn, names, payload, expires_at FROM turn_memory "
                f"WHERE caller = {p} AND kind = {p} AND expires_at > {p} AND call_id IN ({ids})")

    def selection(self, query: ReportQuery) -> tuple[list[str], list[float | str]]:
        """The conditions (ANDed) and their parameters that select a query's records."""
        conditions: list[str] = []
        params: list[float | str] = []
        for column, op, value in (("ts", ">=", query.since), ("ts", "<", query.until),
                                  ("team", "=", query.team), ("key_id", "=", query.key_id)):
            if value is not None:
                conditions.append(f"{column} {op} {self.placeholder}")
                params.append(value)
        return conditions, params

    def latencies(self, query: ReportQuery, limit: int) -> tuple[str, list[float | str]]:
        conditions, params = self.selection(query)
        where = " AND ".join(["outcome = 'ok'", *conditions])
        return (f"SELECT model, latency_ms FROM usage WHERE {where} ORDER BY ts DESC LIMIT {int(limit)}",
                params)

    def report(self, query: ReportQuery) -> tuple[str, list[float | str]]:
        """The aggregate query and its parameters; rows go through `report_rows`."""
        fields = _group_fields(query.group_by)
        conditions, params = self.selection(query)
        group = fields[0][0]
        if query.group_by.startswith("break_"):
            conditions.append("cache_break IS NOT NULL")
            group = f"{group}, cache_break"
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        select = ", ".join(expr for _, expr in fields)
        sql = f"SELECT {select}, {_COUNTER_SELECT} FROM usage{where} GROUP BY {group}"
        return sql, params


def _group_fields(group_by: GroupBy) -> tuple[tuple[str, str], ...]:
    if group_by not in _GROUP_FIELDS:
        raise ValueError(f"unknown group_by {group_by!r}; expected one of {', '.join(GROUP_BYS)}")
    return _GROUP_FIELDS[group_by]


def limit_params(row: LimitRow) -> tuple[Any, ...]:
    return tuple(getattr(row, c) for c in LIMIT_COLUMNS)


def limit_from_row(row: Sequence[Any]) -> LimitRow:
    scope, subject, budget, period, rpm, tpm, conc, updated, currency, turns, cost, repeats = row
    return LimitRow(scope, subject, _int_or_none(budget), period, _int_or_none(rpm), _int_or_none(tpm),
                    _int_or_none(conc), float(updated), currency, _int_or_none(turns), _int_or_none(cost),
                    _int_or_none(repeats))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def reserve_in(cur: Cursor, q: Queries, holds: Sequence[Hold], now: float) -> Hold | None:
    """SQLite's `Store.reserve`, inside the caller's transaction (which holds the database's write lock):
    ledger rows in a fixed order, each seeded and checked; all holds inserted, or the refused one.
    PostgreSQL runs the same steps, with row locks, as the function chatgate_reserve_1 (postgres.py)."""
    for hold in sorted(holds, key=lambda h: (h.scope, h.subject)):
        key = (hold.scope, hold.subject, hold.period_start)
        cur.execute(q.ledger_spent, key)
        row = cur.fetchone()
        if row is None:  # the period's first reservation: its ledger starts from the usage table (a scan)
            cur.execute(q.seed_ledger(hold.scope),
                        (hold.scope, hold.subject, hold.period_start, hold.subject, hold.period_start))
            cur.execute(q.ledger_spent, key)
            row = cur.fetchone()
        spent = int(row[0])
        cur.execute(q.held, (hold.scope, hold.subject, hold.period_start, now))
        held = int(cur.fetchone()[0])
        if spent + held + hold.amount_picousd > hold.budget_picousd:
            return hold
    for hold in holds:
        cur.execute(q.insert_hold, (hold.hold_id, hold.scope, hold.subject, hold.period_start,
                                    hold.amount_picousd, hold.expires_at))
    return None


def renew_in(cur: Cursor, q: Queries, asks: Sequence[LeaseAsk], now: float) -> tuple[int, list[LeaseGrant]]:
    """SQLite's `Store.renew_leases`, inside the caller's transaction (which holds the write lock). PostgreSQL
    runs the same steps, with row locks, as the function chatgate_lease_2 (postgres.py)."""
    ordered = sorted(range(len(asks)), key=lambda i: (asks[i].scope, asks[i].subject))
    spent: dict[int, int] = {}
    free: dict[int, int] = {}
    added: dict[int, int] = {}  # what each ask adds to its ledger
    total: dict[int, int] = {}  # the spend settled under each lease that its ledger has after this
    refused = 0
    for i in ordered:
        a = asks[i]
        key = (a.scope, a.subject, a.period_start)
        cur.execute(q.ledger_spent, key)
        row = cur.fetchone()
        if row is None and a.need_picousd > a.keep_picousd:  # a flush never seeds: see renew_leases
            cur.execute(q.seed_ledger(a.scope),
                        (a.scope, a.subject, a.period_start, a.subject, a.period_start))
            cur.execute(q.ledger_spent, key)
            row = cur.fetchone()
        cur.execute(q.lease_flushed, (a.hold_id,))
        prior = cur.fetchone()
        applied = int(prior[0]) if prior is not None else 0  # with a renewal whose answer was lost
        total[i] = max(a.flushed_picousd + a.spent_picousd, applied)
        added[i] = total[i] - applied
        spent[i] = (int(row[0]) if row is not None else 0) + added[i]
        free[i] = 0
        if a.need_picousd > a.keep_picousd or a.extra_picousd > 0:  # else nothing depends on it
            cur.execute(q.held_by_others, (*key, now, a.hold_id))
            free[i] = a.budget_picousd - spent[i] - int(cur.fetchone()[0])
        if a.need_picousd > a.keep_picousd and free[i] < a.need_picousd and not refused:
            refused = i + 1
    grants = []
    for i, a in enumerate(asks):
        amount = a.keep_picousd if refused else a.need_picousd + max(min(a.extra_picousd,
                                                                         (free[i] - a.need_picousd) // 4), 0)
        if added[i]:
            cur.execute(q.add_spent, (added[i], a.scope, a.subject, a.period_start))
        if amount > 0 or total[i] > 0:  # given back, it stays at 0 until it expires (LeaseAsk)
            cur.execute(q.upsert_lease, (a.hold_id, a.scope, a.subject, a.period_start, amount, a.expires_at,
                                         total[i]))
        else:
            cur.execute(q.take_hold, (a.hold_id,))
        grants.append(LeaseGrant(amount, spent[i]))
    return refused, grants


def settle_in(cur: Cursor, q: Queries, holds: Sequence[Hold], amount: int) -> None:
    """The holds go and the cost is added to their ledgers, even for a hold that expired meanwhile: the money
    was spent all the same."""
    for hold in holds:
        cur.execute(q.take_hold, (hold.hold_id,))
        cur.execute(q.add_spent, (amount, hold.scope, hold.subject, hold.period_start))


@functools.cache
def _remember_turns(p: str, count: int) -> str:
    row = f"({p}, {p}, {p}, {p}, {p}, {p}, {p})"
    return ("INSERT INTO turn_memory (caller, kind, call_id, turn, names, payload, expires_at) "
            f"VALUES {', '.join([row] * count)} "
            "ON CONFLICT (caller, kind, call_id) DO UPDATE SET turn = excluded.turn, "
            "names = excluded.names, payload = excluded.payload, expires_at = excluded.expires_at")


TURN_WIDTH = 7  # parameters per row of turn_params


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


def file_owner_params(owner: FileOwner) -> tuple[Any, ...]:
    return (owner.file_id, owner.team, owner.key_id, owner.created_at, owner.tokens)


def file_id_chunks(file_ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(file_ids), FILE_IDS_PER_QUERY):
        yield file_ids[start:start + FILE_IDS_PER_QUERY]


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
