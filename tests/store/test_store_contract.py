"""One behaviour for both backends: each test taking `store` or `store_url` runs on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from math import inf
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chatgate.store import (
    COUNTERS,
    GROUP_BYS,
    OUTCOMES,
    GroupBy,
    ReportQuery,
    ReportRow,
    Store,
    StoreError,
    StoreRefused,
    UsageRecord,
    open_store,
)
from chatgate.store._sql import CREATE_SCHEMA_VERSION, MIGRATIONS, SCHEMA_VERSION, USAGE_COLUMNS
from chatgate.store.base import FileOwner, Hold, LeaseAsk, LeaseGrant, LimitRow, TurnRow
from chatgate.store.postgres import PostgresStore
from chatgate.store.sqlite import SQLiteStore, _chunk_sizes
from tests import lifeline
from tests.store.conftest import TcpProxy

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
DAY = 86_400.0
KEYS = {"k1": ("alpha", "red"), "k2": ("beta", "red"), "k3": ("gamma", "blue")}
MODELS = ("deepseek-chat", "deepseek-reasoner")
TOKEN_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "prompt_cache_hit_tokens",
    "prompt_cache_miss_tokens",
    "reasoning_tokens",
    "cost_picousd",
)


def record(record_id: str, ts: float = T0, key_id: str = "k1", **fields: Any) -> UsageRecord:
    name, team = KEYS[key_id]
    base: dict[str, Any] = {
        "request_id": f"req-{record_id}",
        "key_name": name,
        "team": team,
        "model": "deepseek-chat",
        "route": "/v1/chat/completions",
        "stream": False,
        "outcome": "ok",
    }
    return UsageRecord(record_id=record_id, ts=ts, key_id=key_id, **(base | fields))


def random_records(n: int, seed: int) -> list[UsageRecord]:
    rnd = random.Random(seed)
    return [
        record(
            f"r{seed}-{i}",
            ts=T0 + rnd.uniform(0, 4 * DAY),
            key_id=rnd.choice(sorted(KEYS)),
            model=rnd.choice(MODELS),
            stream=rnd.random() < 0.5,
            outcome=rnd.choice(OUTCOMES),
            rule_code=rnd.choice([None, "max_tokens"]),
            upstream_status=rnd.choice([None, 200, 400, 401, 429, 499, 500, 503]),
            latency_ms=rnd.uniform(1, 5000),
            ttfb_ms=rnd.choice([None, 12.5]),
            tokens_exact=rnd.random() < 0.8,
            repairs=rnd.choice([None, None, "restore_reasoning", "thinking_conflict",
                                "restore_reasoning,developer_role"]),
            unpriced=rnd.random() < 0.1,
            attempts=rnd.choice([1, 1, 2, 3]), account=rnd.choice([None, "one", "two"]),
            billed_unit=(unit := rnd.choice([None, None, "call", "page", "character"])),
            billed_units=rnd.randrange(1, 5000) if unit is not None else 0,
            billed_estimated=unit is not None and rnd.random() < 0.3,
            billed_picousd=rnd.randrange(10**12) if unit is not None else 0,
            **{name: rnd.randrange(10**15 if name == "cost_picousd" else 100_000) for name in TOKEN_FIELDS},
        )
        for i in range(n)
    ]


def reference_report(records: Sequence[UsageRecord], query: ReportQuery) -> list[ReportRow]:
    rows: dict[tuple[str, ...], ReportRow] = {}
    since = -inf if query.since is None else query.since
    until = inf if query.until is None else query.until
    for r in records:
        if not since <= r.ts < until:
            continue
        groups = {
            "key": [{"key_id": r.key_id, "key_name": r.key_name, "team": r.team}],
            "team": [{"team": r.team}],
            "model": [{"model": r.model}],
            "day": [{"day": r.day}],
            "rule": [{"rule_code": r.rule_code or ""}],
            # a request counts under each of its repairs
            "repair": [{"repair": code} for code in (r.repairs or "").split(",")],
            "account": [{"account": r.account or ""}],
        }[query.group_by]
        for group in groups:
            counters = rows.setdefault(tuple(group.values()), ReportRow(group=group)).counters
            counters["requests"] += 1
            counters["rejected"] += r.outcome == "rejected"
            counters["limited"] += r.outcome == "limited"
            deepseek_4xx = r.outcome == "upstream_error" and r.upstream_status is not None \
                and 400 <= r.upstream_status < 500
            counters["upstream_refused"] += deepseek_4xx
            counters["upstream_failed"] += r.outcome == "upstream_failed" or (
                r.outcome == "upstream_error" and not deepseek_4xx)
            counters["estimated_requests"] += not r.tokens_exact
            counters["unpriced_requests"] += r.unpriced
            for unit in ("call", "page", "character"):
                counters[f"billed_{unit}s"] += r.billed_units if r.billed_unit == unit else 0
            counters["billed_picousd"] += r.billed_picousd
            counters["billed_estimated_requests"] += r.billed_estimated
            for name in TOKEN_FIELDS:
                counters[name] += getattr(r, name)
    return [rows[k] for k in sorted(rows)]


def total_requests(store: Store) -> int:
    return sum(row.counters["requests"] for row in store.usage_report(ReportQuery("team")))


def run_all(*targets: Callable[[], object]) -> None:
    """Run the targets in threads released together; re-raise the first failure."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def run(target: Callable[[], object]) -> None:
        barrier.wait()
        try:
            target()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_processes(code: str, *args: str, count: int) -> None:
    procs = [
        lifeline.Popen([sys.executable, "-c", code, *args, str(i)], cwd=REPO, stderr=subprocess.PIPE)
        for i in range(count)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()


def schema_version(store: Store) -> int:
    assert isinstance(store, SQLiteStore | PostgresStore)
    return store.schema_version()


# --- open_store -------------------------------------------------------------------------------


def test_open_store_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite:///data/rel.db")
    absolute = open_store(f"sqlite:///{tmp_path}/abs/abs.db")
    try:
        assert isinstance(relative, SQLiteStore) and isinstance(absolute, SQLiteStore)
        relative.migrate()
        absolute.migrate()
        assert (tmp_path / "data" / "rel.db").exists()
        assert (tmp_path / "abs" / "abs.db").exists()
        assert absolute.url == f"sqlite:///{tmp_path}/abs/abs.db"
    finally:
        relative.close()
        absolute.close()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_postgres_urls(scheme: str) -> None:
    store = open_store(f"{scheme}://nobody@127.0.0.1:1/none")  # opening does not connect
    try:
        assert isinstance(store, PostgresStore)
    finally:
        store.close()


@pytest.mark.parametrize(
    "url", ["mysql://u@h/db", "sqlite.db", "sqlite://relative.db", "sqlite:///", "sqlite:///:memory:", ""]
)
def test_open_store_rejects_unknown_urls(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        open_store(url)


def test_open_store_error_hides_password() -> None:
    with pytest.raises(ValueError) as info:
        open_store("mysql://user:s3cret@host/db")
    assert "s3cret" not in str(info.value)


# --- migrations -------------------------------------------------------------------------------


def test_migrate_twice_is_a_noop(store: Store) -> None:
    store.insert_usage([record("a")])
    store.migrate()
    assert schema_version(store) == SCHEMA_VERSION
    assert total_requests(store) == 1


def test_schema_version_before_migrate(make_store: Callable[[], Store]) -> None:
    assert schema_version(make_store()) == 0


def test_concurrent_migrate_from_threads(make_store: Callable[[], Store]) -> None:
    stores = [make_store() for _ in range(4)]
    run_all(*(s.migrate for s in stores))
    assert {schema_version(s) for s in stores} == {SCHEMA_VERSION}
    stores[0].insert_usage([record("a")])
    assert total_requests(stores[-1]) == 1


@pytest.mark.slow
def test_concurrent_migrate_from_processes(store_url: str, make_store: Callable[[], Store]) -> None:
    code = ("import sys; from chatgate.store import open_store; s = open_store(sys.argv[1]); "
            "s.migrate(); s.close()")
    run_processes(code, store_url, count=4)
    assert schema_version(make_store()) == SCHEMA_VERSION


# --- usage ------------------------------------------------------------------------------------


def test_insert_is_idempotent(store: Store) -> None:
    first = random_records(50, seed=1)
    store.insert_usage(first)
    store.insert_usage(first[:20])
    store.insert_usage(first[40:] + random_records(10, seed=2))
    assert total_requests(store) == 60
    query = ReportQuery("key")
    assert store.usage_report(query) == reference_report(first + random_records(10, seed=2), query)


def test_duplicate_ids_inside_one_batch_count_once(store: Store) -> None:
    store.insert_usage([record("a"), record("a"), record("b")])
    assert total_requests(store) == 2


def test_empty_batch_and_empty_report(store: Store) -> None:
    store.insert_usage([])
    for group_by in GROUP_BYS:
        assert store.usage_report(ReportQuery(group_by)) == []


def test_large_batch(store: Store) -> None:
    records = random_records(2500, seed=3)
    for start in range(0, len(records), 1000):
        store.insert_usage(records[start : start + 1000])
    assert total_requests(store) == 2500


def test_report_by_hand(store: Store) -> None:
    store.insert_usage(
        [
            record("a", ts=T0, prompt_tokens=10, completion_tokens=5, cost_picousd=100),
            record("b", ts=T0 + 10, outcome="rejected", rule_code="max_tokens"),
            record(
                "c",
                ts=T0 + DAY,
                key_id="k3",
                model="deepseek-reasoner",
                prompt_tokens=7,
                completion_tokens=3,
                reasoning_tokens=2,
                prompt_cache_hit_tokens=4,
                prompt_cache_miss_tokens=3,
                cost_picousd=50,
                tokens_exact=False,
            ),
        ]
    )

    def counters(**nonzero: int) -> dict[str, int]:
        return dict.fromkeys(COUNTERS, 0) | nonzero

    blue = counters(
        requests=1,
        prompt_tokens=7,
        completion_tokens=3,
        reasoning_tokens=2,
        prompt_cache_hit_tokens=4,
        prompt_cache_miss_tokens=3,
        cost_picousd=50,
        estimated_requests=1,
    )
    red = counters(requests=2, rejected=1, prompt_tokens=10, completion_tokens=5, cost_picousd=100)
    assert store.usage_report(ReportQuery("team")) == [
        ReportRow({"team": "blue"}, blue),
        ReportRow({"team": "red"}, red),
    ]
    assert store.usage_report(ReportQuery("key")) == [
        ReportRow({"key_id": "k1", "key_name": "alpha", "team": "red"}, red),
        ReportRow({"key_id": "k3", "key_name": "gamma", "team": "blue"}, blue),
    ]
    assert store.usage_report(ReportQuery("model")) == [
        ReportRow({"model": "deepseek-chat"}, red),
        ReportRow({"model": "deepseek-reasoner"}, blue),
    ]
    assert store.usage_report(ReportQuery("day")) == [
        ReportRow({"day": "2023-11-14"}, red),
        ReportRow({"day": "2023-11-15"}, blue),
    ]
    assert store.usage_report(ReportQuery("team", since=T0 + 10, until=T0 + DAY)) == [
        ReportRow({"team": "red"}, counters(requests=1, rejected=1))
    ]


def test_report_counts_each_outcome_apart(store: Store) -> None:
    """refused by a rule, limited, refused by DeepSeek (4xx), failed at DeepSeek (5xx after the retries, a
    stream ended by DeepSeek's error event, no answer): each its own counter; answered and disconnected in
    none of them."""
    kinds = [("ok", None, 200), ("rejected", "empty_array", None), ("limited", "rpm:key", None),
             ("limited", "budget:team", None), ("upstream_error", None, 400), ("upstream_error", None, 401),
             ("upstream_error", None, 429), ("upstream_error", None, 503), ("upstream_error", None, 200),
             ("upstream_failed", None, None), ("upstream_failed", None, 200),
             ("client_disconnected", None, 200)]
    store.insert_usage([record(f"o{i}", ts=T0 + i, outcome=outcome, rule_code=code, upstream_status=status)
                        for i, (outcome, code, status) in enumerate(kinds)])
    (row,) = store.usage_report(ReportQuery("team"))
    assert {name: row.counters[name] for name in ("requests", "rejected", "limited", "upstream_refused",
                                                    "upstream_failed")} == {
        "requests": 12, "rejected": 1, "limited": 2, "upstream_refused": 3, "upstream_failed": 4}
    by_rule = {r.group["rule_code"]: (r.counters["rejected"], r.counters["limited"])
               for r in store.usage_report(ReportQuery("rule"))}
    assert by_rule == {"": (0, 0), "budget:team": (0, 1), "empty_array": (1, 0), "rpm:key": (0, 1)}


@pytest.mark.parametrize("group_by", GROUP_BYS)
def test_report_matches_reference(store: Store, group_by: GroupBy) -> None:
    records = random_records(400, seed=4)
    store.insert_usage(records)
    boundary = records[7].ts  # a stored ts: since includes it, until excludes it
    windows = [(None, None), (T0 + DAY, None), (None, T0 + 2 * DAY), (boundary, T0 + 3 * DAY), (T0, boundary)]
    for since, until in windows:
        query = ReportQuery(group_by, since=since, until=until)
        assert store.usage_report(query) == reference_report(records, query), query


def test_report_rejects_unknown_group(store: Store) -> None:
    with pytest.raises(ValueError, match="group_by"):
        store.usage_report(ReportQuery("colour"))  # type: ignore[arg-type]


def test_cost_sums_are_exact(store: Store) -> None:
    costs = [10**15 + 7 * i + 1 for i in range(3000)]  # the sum is far beyond float precision
    store.insert_usage([record(f"c{i}", cost_picousd=cost) for i, cost in enumerate(costs)])
    [row] = store.usage_report(ReportQuery("team"))
    assert type(row.counters["cost_picousd"]) is int
    assert row.counters["cost_picousd"] == sum(costs)
    assert float(sum(costs)) != sum(costs)


# --- keys -------------------------------------------------------------------------------------


def test_keys(store: Store) -> None:
    before = time.time()
    first = store.create_key("k1", "hash1", "cg_ab", "red", "alpha")
    second = store.create_key("k2", "hash2", "cg_cd", "blue", "beta")
    assert before <= first.created_at <= second.created_at <= time.time()
    assert first.active and first.prefix == "cg_ab" and first.team == "red" and first.name == "alpha"
    assert store.list_keys() == [first, second]
    assert store.find_key("hash2") == second
    assert store.find_key("nope") is None

    assert store.revoke_key("k1") is True
    assert store.revoke_key("k1") is False
    assert store.revoke_key("missing") is False
    revoked = store.find_key("hash1")
    assert revoked is not None and not revoked.active
    assert revoked.revoked_at is not None and revoked.revoked_at >= first.created_at
    assert [k.key_id for k in store.list_keys()] == ["k1", "k2"]


@pytest.mark.parametrize(("key_id", "key_hash"), [("k1", "other"), ("other", "hash1")])
def test_duplicate_key_is_a_store_error(store: Store, key_id: str, key_hash: str) -> None:
    store.create_key("k1", "hash1", "cg_ab", "red", "alpha")
    with pytest.raises(StoreError):
        store.create_key(key_id, key_hash, "cg_xx", "red", "dup")
    assert len(store.list_keys()) == 1


# --- health, concurrency, lifecycle -----------------------------------------------------------


def test_ping(store: Store) -> None:
    store.ping()


def test_closed_store_raises_store_error(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.migrate()
    store.close()
    with pytest.raises(StoreError):
        store.find_key("x")


def test_lookups_while_a_writer_inserts(store: Store) -> None:
    store.create_key("k1", "hash1", "cg_ab", "red", "alpha")
    batches = [random_records(200, seed=s) for s in range(10, 20)]

    def write() -> None:
        for batch in batches:
            store.insert_usage(batch)

    def look_up() -> None:
        for _ in range(200):
            key = store.find_key("hash1")
            assert key is not None and key.key_id == "k1"

    run_all(write, look_up, look_up, look_up)
    assert total_requests(store) == 2000


# --- SQLite specifics -------------------------------------------------------------------------


def test_sqlite_settings(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "nested" / "dir" / "s.db")
    try:
        store.migrate()
        assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        with sqlite3.connect(store.path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


@pytest.mark.parametrize("sizes", [[1], [255, 256, 257], [1000, 3, 1337]])
def test_sqlite_stores_every_column_of_every_record(tmp_path: Path, sizes: list[int]) -> None:
    """Rows go in as multi-row statements of power-of-two sizes: every batch size, every column, in place."""
    store = SQLiteStore(tmp_path / "s.db")
    batches = [random_records(n, seed=i) for i, n in enumerate(sizes)]
    try:
        store.migrate()
        for batch in batches:
            store.insert_usage(batch)
        with sqlite3.connect(store.path) as raw:
            raw.row_factory = sqlite3.Row
            rows = {row["record_id"]: dict(row) for row in raw.execute("SELECT * FROM usage")}
    finally:
        store.close()
    expected = [r for batch in batches for r in batch]
    assert len(rows) == len(expected)
    for rec in expected:
        row = rows[rec.record_id]
        assert row.pop("day") == rec.day
        assert {k: (bool(v) if k in ("stream", "tokens_exact") else v) for k, v in row.items()} == \
            dataclasses.asdict(rec)


def test_sqlite_statement_sizes_cover_any_batch() -> None:
    assert list(_chunk_sizes(1337, 256)) == [256] * 5 + [32, 16, 8, 1]
    assert list(_chunk_sizes(256, 256)) == [256]
    assert list(_chunk_sizes(7, 4)) == [4, 2, 1]
    assert list(_chunk_sizes(0, 256)) == []


@pytest.mark.slow
def test_sqlite_two_stores_on_one_file_both_writing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    one, two = open_store(url), open_store(url)
    try:
        run_all(one.migrate, two.migrate)
        batches = [random_records(100, seed=s) for s in range(30, 50)]
        run_all(
            *(lambda b=b, s=s: s.insert_usage(b) for b, s in zip(batches, [one, two] * 10, strict=True)),
        )
        code = (
            "import sys; from tests.store.test_store_contract import random_records; "
            "from chatgate.store import open_store; s = open_store(sys.argv[1]); "
            "[s.insert_usage(random_records(50, seed=1000 + 10 * int(sys.argv[2]) + k)) for k in range(10)]"
        )
        run_processes(code, url, count=3)
        assert total_requests(one) == total_requests(two) == 2000 + 3 * 500
    finally:
        one.close()
        two.close()


def test_sqlite_ping_fails_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db", busy_timeout_ms=100)
    try:
        store.migrate()
        other = sqlite3.connect(store.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="locked"):
            store.ping()
        other.execute("ROLLBACK")
        other.close()
        store.ping()
    finally:
        store.close()


def test_sqlite_connections_of_finished_threads_are_closed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        store.migrate()
        for _ in range(5):
            thread = threading.Thread(target=store.list_keys)
            thread.start()
            thread.join()
        store.list_keys()
        assert len(store._conns) <= 2
    finally:
        store.close()


# --- PostgreSQL specifics ---------------------------------------------------------------------


def _kill_other_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def _eventually(call: Callable[[], object], attempts: int = 2) -> None:
    """The call works within `attempts` tries; earlier tries may only fail with StoreError."""
    for _ in range(attempts - 1):
        try:
            call()
            return
        except StoreError:
            pass
    call()


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_recovers_after_its_connections_are_killed(pg_url: str) -> None:
    store = PostgresStore(pg_url, timeout=2)
    try:
        store.migrate()
        store.insert_usage([record("a")])
        assert _kill_other_backends(pg_url) >= 1
        _eventually(lambda: store.insert_usage([record("b")]))
        assert _kill_other_backends(pg_url) >= 1
        _eventually(store.ping)
        assert total_requests(store) == 2
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_outage_raises_store_error_then_recovers(pg_proxy_url: tuple[TcpProxy, str]) -> None:
    proxy, url = pg_proxy_url
    store = PostgresStore(url, timeout=1)
    try:
        store.migrate()
        proxy.stop()
        for _ in range(3):
            with pytest.raises(StoreError):
                store.insert_usage([record("lost")])
        with pytest.raises(StoreError):
            store.ping()
        proxy.start()
        _eventually(lambda: store.insert_usage([record("a")]))
        store.ping()
        assert total_requests(store) == 1
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_dead_network_path_times_out_then_recovers(pg_proxy_url: tuple[TcpProxy, str]) -> None:
    proxy, url = pg_proxy_url
    store = PostgresStore(url, timeout=1, insert_timeout=2, slow_timeout=2)
    try:
        store.migrate()
        store.insert_usage([record("a")])
        proxy.blackhole = True
        calls: list[Callable[[], object]] = [
            store.ping,
            lambda: store.insert_usage([record("lost")]),
            lambda: store.usage_report(ReportQuery("team")),
            lambda: store.find_key("x"),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreError):
                call()
            assert time.monotonic() - started < 8
        proxy.blackhole = False
        _eventually(lambda: store.insert_usage([record("b")]))
        assert total_requests(store) == 2
    finally:
        store.close()


def test_postgres_unreachable_is_a_store_error() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/none", timeout=0.5)
    try:
        calls: list[Callable[[], object]] = [store.migrate, store.ping, lambda: store.find_key("x")]
        for call in calls:
            with pytest.raises(StoreError, match=r"PostgreSQL store: .*\(connection failed: .*refused"):
                call()
    finally:
        store.close()


def test_migration_from_version_1_drops_the_unused_indexes(tmp_path: Path) -> None:
    """A store created by schema version 1 is upgraded in place."""
    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db)
    conn.execute(CREATE_SCHEMA_VERSION)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 0)")
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    store.migrate()
    assert store.schema_version() == SCHEMA_VERSION
    rows = sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    names = {row[0] for row in rows}
    assert "usage_ts" in names and not names & {"usage_team", "usage_key_id", "usage_model", "usage_day"}
    store.close()


def test_migration_from_version_2_keeps_old_records_and_adds_repairs_and_turns(tmp_path: Path) -> None:
    db = tmp_path / "v2.db"
    conn = sqlite3.connect(db)
    conn.execute(CREATE_SCHEMA_VERSION)
    for version in (1, 2):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
    columns = list(USAGE_COLUMNS[:USAGE_COLUMNS.index("repairs")])  # the columns of version 2
    old = record("old-1")
    values = {**{c: getattr(old, c, None) for c in columns}, "day": old.day}
    conn.execute(f"INSERT INTO usage ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                 [values[c] for c in columns])
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    store.migrate()
    assert store.schema_version() == SCHEMA_VERSION
    store.insert_usage([record("new-1", repairs="restore_reasoning", unpriced=True, attempts=2,
                               account="one")])
    kept = sqlite3.connect(db).execute("SELECT record_id, attempts, account FROM usage ORDER BY record_id")
    assert kept.fetchall() == [("new-1", 2, "one"), ("old-1", 1, None)]  # old records: one attempt
    by_repair = store.usage_report(ReportQuery("repair"))
    assert [(r.group["repair"], r.counters["requests"]) for r in by_repair] == [("", 1),
                                                                              ("restore_reasoning", 1)]
    assert [(r.group["repair"], r.counters["unpriced_requests"]) for r in by_repair] == [
        ("", 0), ("restore_reasoning", 1)], "an old record is priced (migration 7's default)"
    store.remember_turns([TurnRow("fp-1", "chat", "call_1", "t1", "f", "why", time.time() + 60)])
    assert [r.payload for r in store.recall_turns("fp-1", "chat", ["call_1"], time.time())] == ["why"]
    store.close()


# --- the owners of uploaded files (managed mode's Files API) ----------------------------------------


def test_a_file_has_one_owner_the_first_recorded(store: Store) -> None:
    first = FileOwner("file-api-1", "search", "key_a1", T0)
    assert store.file_owner("file-api-1") is None
    assert store.own_file(first) is True
    assert store.own_file(FileOwner("file-api-1", "ads", "key_b1", T0 + 1)) is False, "never taken over"
    assert store.file_owner("file-api-1") == first
    assert store.file_owner("file-api-2") is None


def test_files_owned_are_those_of_the_team_only(store: Store) -> None:
    for n, team in enumerate(["search", "ads", "search", "ads"]):
        store.own_file(FileOwner(f"file-api-{n}", team, f"key_{team}", T0 + n))
    ids = ["file-api-0", "file-api-1", "file-api-2", "file-api-3", "file-api-unknown", "file-api-0"]
    assert store.files_owned("search", ids) == {"file-api-0", "file-api-2"}
    assert store.files_owned("ads", ids) == {"file-api-1", "file-api-3"}
    assert store.files_owned("nobody", ids) == set()
    assert store.files_owned("search", []) == set()


def test_files_owned_takes_a_page_of_any_size(store: Store) -> None:
    ids = [f"file-api-{n:04}" for n in range(1500)]  # more than one statement's worth of parameters
    for file_id in ids[::3]:
        store.own_file(FileOwner(file_id, "search", "key_a1", T0))
    assert store.files_owned("search", ids) == set(ids[::3])


def test_a_files_token_count_is_kept_with_its_owner(store: Store) -> None:
    """Counted once at upload (issue 48): what a request naming the file reserves."""
    store.own_file(FileOwner("file-api-1", "search", "key_a1", T0, 12_345))
    store.own_file(FileOwner("file-api-2", "search", "key_a1", T0))  # a document whose count is not known
    assert store.file_owner("file-api-1") == FileOwner("file-api-1", "search", "key_a1", T0, 12_345)
    ids = [f"file-api-{n}" for n in range(3)] * 400  # more than one statement's worth, repeated
    assert store.file_tokens(ids) == {"file-api-1": 12_345, "file-api-2": None}
    assert store.file_tokens([]) == {}


def test_a_disowned_file_belongs_to_nobody(store: Store) -> None:
    store.own_file(FileOwner("file-api-1", "search", "key_a1", T0))
    assert store.disown_file("file-api-1") is True
    assert store.disown_file("file-api-1") is False
    assert store.file_owner("file-api-1") is None
    assert store.files_owned("search", ["file-api-1"]) == set()
    assert store.own_file(FileOwner("file-api-1", "ads", "key_b1", T0)) is True


def test_migration_from_version_4_adds_file_owners(tmp_path: Path) -> None:
    db = tmp_path / "v4.db"
    conn = sqlite3.connect(db)
    conn.execute(CREATE_SCHEMA_VERSION)
    for version in range(1, 5):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    try:
        store.migrate()
        assert store.schema_version() == SCHEMA_VERSION
        assert store.own_file(FileOwner("file-api-1", "search", "key_a1", T0)) is True
    finally:
        store.close()


# --- the memory of relayed turns (restore_reasoning) ---------------------------------------------


def turn(caller: str, call_id: str, payload: str = "reasoning", expires_in: float = 60.0, turn_id: str = "t1",
         kind: str = "chat") -> TurnRow:
    return TurnRow(caller, kind, call_id, turn_id, "search,lookup", payload, time.time() + expires_in)


def test_turns_are_recalled_only_by_their_caller_and_kind(store: Store) -> None:
    store.remember_turns([turn("fp-a", "call_1", "a's reasoning"), turn("fp-a", "call_2", "a's reasoning"),
                          turn("fp-b", "call_3", "b's"),
                          turn("fp-a", "call_4", "other family", kind="anthropic")])
    now = time.time()
    got = sorted(store.recall_turns("fp-a", "chat", ["call_1", "call_2", "call_3", "call_4"], now),
                 key=lambda r: r.call_id)
    assert [(r.call_id, r.payload, r.names) for r in got] == [("call_1", "a's reasoning", "search,lookup"),
                                                              ("call_2", "a's reasoning", "search,lookup")]
    assert store.recall_turns("fp-b", "chat", ["call_1", "call_2"], now) == []
    assert [r.payload for r in store.recall_turns("fp-a", "anthropic", ["call_4"], now)] == ["other family"]
    assert store.recall_turns("fp-a", "chat", [], now) == []


def test_a_turn_remembered_again_replaces_the_old_one(store: Store) -> None:
    store.remember_turns([turn("fp-a", "call_1", "first", turn_id="t1")])
    store.remember_turns([turn("fp-a", "call_1", "second", turn_id="t2", expires_in=120)])
    (row,) = store.recall_turns("fp-a", "chat", ["call_1"], time.time())
    assert (row.payload, row.turn) == ("second", "t2")
    store.remember_turns([turn("fp-a", "call_1", "third", turn_id="t3"),  # one batch: the last one wins
                          turn("fp-a", "call_1", "fourth", turn_id="t4")])
    (row,) = store.recall_turns("fp-a", "chat", ["call_1"], time.time())
    assert (row.payload, row.turn) == ("fourth", "t4")


def test_expired_turns_are_not_recalled_and_are_purged(store: Store) -> None:
    store.remember_turns([turn("fp-a", "old", expires_in=-1), turn("fp-a", "new", "x" * 100_000)])
    now = time.time()
    assert [r.call_id for r in store.recall_turns("fp-a", "chat", ["old", "new"], now)] == ["new"]
    assert store.purge_turns(now) == 1
    assert store.purge_turns(now) == 0
    assert [len(r.payload) for r in store.recall_turns("fp-a", "chat", ["new"], now)] == [100_000]
    assert store.purge_turns(now + 3600) == 1
    assert store.recall_turns("fp-a", "chat", ["new"], now) == []


def test_a_batch_of_records_and_turns_is_stored_in_one_transaction(store: Store) -> None:
    """The usage writer's batch (insert_batch): both parts or neither; inserts stay idempotent."""
    records = [record("a"), record("b")]
    store.insert_batch(records, [turn("fp-a", "call_1", "one"), turn("fp-a", "call_2", "two")])
    store.insert_batch(records[:1], [turn("fp-a", "call_1", "one again")])
    store.insert_batch([], [])
    assert total_requests(store) == 2
    got = store.recall_turns("fp-a", "chat", ["call_1", "call_2"], time.time())
    assert sorted(r.payload for r in got) == ["one again", "two"]
    with pytest.raises(StoreError):  # a row neither backend takes (no expiry; a NUL): nothing is kept
        store.insert_batch([record("c")], [turn("fp-a", "call_\x00", "x", expires_in=float("nan"))])
    assert total_requests(store) == 2


def test_a_value_the_store_cannot_hold_is_refused_not_an_outage(store: Store) -> None:
    """StoreRefused, not a plain StoreError: the usage writer drops such a row (logged) instead of retrying
    it for ever as it does through an outage. SQLite: no expiry (NOT NULL); PostgreSQL: a NUL in a text."""
    bad = (turn("fp-a", "call_1", expires_in=float("nan")) if isinstance(store, SQLiteStore)
           else turn("fp-a", "call_\x00"))
    with pytest.raises(StoreRefused):
        store.remember_turns([bad])
    if not isinstance(store, SQLiteStore):
        with pytest.raises(StoreRefused):
            store.insert_usage([record("a", model="deepseek-chat\x00")])
    store.insert_usage([record("b")])
    assert total_requests(store) == 1


def test_turns_are_shared_by_stores_on_one_url(make_store: Callable[[], Store]) -> None:
    """Two replicas (two stores on one database): what one remembers, the other recalls at once."""
    first, second = make_store(), make_store()
    first.migrate()
    first.remember_turns([turn("fp-a", "call_9", "shared")])
    assert [r.payload for r in second.recall_turns("fp-a", "chat", ["call_9"], time.time())] == ["shared"]


def test_a_turn_written_at_once_is_there_for_another_replica(make_store: Callable[[], Store]) -> None:
    """try_remember_turns: SQLite writes on the calling thread (committed: another store on the file reads
    it at once); PostgreSQL never does (a round trip), and says so without writing."""
    first, second = make_store(), make_store()
    first.migrate()
    written = first.try_remember_turns([turn("fp-a", "call_1", "now")])
    assert written is isinstance(first, SQLiteStore)
    found = second.recall_turns("fp-a", "chat", ["call_1"], time.time())
    assert [r.payload for r in found] == (["now"] if written else [])


def test_sqlite_does_not_write_at_once_when_it_would_have_to_wait(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    store.migrate()
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process writing
        started = time.monotonic()
        assert store.try_remember_turns([turn("fp-a", "call_1", "x")]) is False
        assert time.monotonic() - started < 0.5, "no busy wait"
        other.execute("ROLLBACK")
        with store._writing:  # this process's usage writer in a transaction
            assert store.try_remember_turns([turn("fp-a", "call_1", "x")]) is False
        assert store.recall_turns("fp-a", "chat", ["call_1"], time.time()) == []
        assert store.try_remember_turns([turn("fp-a", "call_1", "x")]) is True
        assert [r.payload for r in store.recall_turns("fp-a", "chat", ["call_1"], time.time())] == ["x"]
    finally:
        other.close()
        store.close()


# --- limits and budgets (issue 15) ----------------------------------------------------------------

def hold(subject: str, amount: int, budget: int = 1000, scope: str = "team", period: float = T0,
         expires_in: float = 60.0) -> Hold:
    return Hold(f"h-{subject}-{amount}-{time.monotonic_ns()}", scope, subject, period, budget, amount,
                time.time() + expires_in)


def test_limits_are_set_listed_changed_and_cleared(store: Store) -> None:
    store.set_limits(LimitRow("team", "search", 50 * 10**12, "month", rpm=60, updated_at=1.0))
    store.set_limits(LimitRow("key", "fp-abc", max_concurrent=2, updated_at=2.0))
    assert store.get_limits("team", "search") == LimitRow("team", "search", 50 * 10**12, "month", 60, None,
                                                          None, 1.0)
    assert [r.subject for r in store.list_limits("key")] == ["fp-abc"]
    store.set_limits(LimitRow("team", "search", rpm=10, updated_at=3.0))
    assert store.get_limits("team", "search") == LimitRow("team", "search", rpm=10, updated_at=3.0)
    store.set_limits(LimitRow("team", "search", updated_at=4.0))  # nothing left: the row goes
    assert store.get_limits("team", "search") is None and store.get_limits("team", "nobody") is None


def test_spend_sums_the_usage_of_a_team_or_key_since_a_time(store: Store) -> None:
    store.insert_usage([record("a", team="red", key_id="k1", cost_picousd=5, ts=T0),
                        record("b", team="red", key_id="k2", cost_picousd=7, ts=T0 + 10),
                        record("c", team="blue", key_id="k1", cost_picousd=100, ts=T0 + 20)])
    assert store.spend("team", "red", T0) == 12 and store.spend("team", "red", T0 + 5) == 7
    assert store.spend("key", "k1", T0) == 105 and store.spend("key", "none", 0) == 0


def test_costs_and_budgets_keep_their_currency(store: Store) -> None:
    """Yuan (issue 46): a record's costs are in its currency, summed apart in reports, never added to the
    other's; a budget's currency is kept, and its spend and the ledger it starts count that currency only."""
    store.insert_usage([record("u", team="red", cost_picousd=5, cache_saved_picousd=1, ts=T0),
                        record("c", team="red", cost_picousd=70, cache_saved_picousd=9, ts=T0 + 1,
                               currency="CNY")])
    (row,) = store.usage_report(ReportQuery("team"))
    assert (row.counters["cost_picousd"], row.counters["cost_picocny"]) == (5, 70)
    assert (row.counters["cache_saved_picousd"], row.counters["cache_saved_picocny"]) == (1, 9)
    assert store.spend("team", "red", T0) == 5  # no budget: USD
    assert store.spend("team", "red", T0, "CNY") == 70
    store.set_limits(LimitRow("team", "red", 1000, "month", updated_at=1.0, budget_currency="CNY"))
    limits = store.get_limits("team", "red")
    assert limits is not None and limits.budget_currency == "CNY"
    assert store.spend("team", "red", T0) == 70  # its budget's currency
    now = time.time()
    assert store.reserve([hold("red", 900)], now) is None
    assert store.budget_state("team", "red", T0, now) == (70, 900), "the ledger starts from the yuan records"
    assert store.reserve([hold("red", 31)], now) is not None


def test_reserve_is_all_or_nothing_and_counts_spend_and_holds(store: Store) -> None:
    store.insert_usage([record("old", team="red", cost_picousd=300, ts=T0 + 1)])
    now = time.time()
    first = hold("red", 400)
    assert store.reserve([first, hold("k9", 10, scope="key")], now) is None
    assert store.budget_state("team", "red", T0, now) == (300, 400), "the ledger starts from the usage"
    over = hold("red", 301)
    key_ok = hold("k9", 10, scope="key")
    assert store.reserve([key_ok, over], now) == over
    assert store.budget_state("key", "k9", T0, now) == (0, 10), "the key's hold was not added either"
    assert store.reserve([hold("red", 300)], now) is None, "exactly the budget fits"
    store.settle([first], 120)
    assert store.budget_state("team", "red", T0, now) == (420, 300)


def test_settling_an_expired_hold_still_counts_its_cost(store: Store) -> None:
    now = time.time()
    late = hold("red", 500, expires_in=-1)
    assert store.reserve([hold("red", 100), late], now) is None
    assert store.purge_holds(now) == 1
    store.settle([late], 70)
    assert store.budget_state("team", "red", T0, now) == (70, 100)


def test_expired_holds_stop_counting_and_are_purged(store: Store) -> None:
    now = time.time()
    assert store.reserve([hold("red", 900, expires_in=-1)], now) is None
    assert store.budget_state("team", "red", T0, now) == (0, 0)
    assert store.reserve([hold("red", 1000)], now) is None
    assert store.purge_holds(now) == 1


def test_concurrent_reservations_from_two_stores_never_exceed_the_budget(make_store: Callable[[], Store]
                                                                         ) -> None:
    """Two replicas (two stores on one database), 8 threads each asking for 10 of a budget of 100."""
    stores = [make_store(), make_store()]
    stores[0].migrate()
    admitted: list[bool] = []

    def ask(n: int) -> None:
        for _ in range(5):
            admitted.append(stores[n % 2].reserve([hold("red", 10, budget=100)], time.time()) is None)

    run_all(*[lambda n=n: ask(n) for n in range(8)])
    assert admitted.count(True) == 10 and len(admitted) == 40
    assert stores[1].budget_state("team", "red", T0, time.time()) == (0, 100)


def test_reservations_and_settlements_of_team_and_key_race_without_deadlock(make_store: Callable[[], Store]
                                                                          ) -> None:
    """Two replicas reserving and settling a team and a key hold at once (given team first, as the gate
    does): the ledger rows are always locked in one order, so no transaction deadlocks and every cost
    lands in both ledgers."""
    stores = [make_store(), make_store()]
    stores[0].migrate()
    budget = 10**9

    def work(n: int) -> None:
        for i in range(10):
            holds = [hold("red", 7, budget=budget), hold(f"k{n % 2}", 7, budget=budget, scope="key")]
            assert stores[n % 2].reserve(holds, time.time()) is None
            stores[(n + i) % 2].settle(holds, 5)

    run_all(*[lambda n=n: work(n) for n in range(6)])
    now = time.time()
    assert stores[0].budget_state("team", "red", T0, now) == (6 * 10 * 5, 0)
    assert stores[1].budget_state("key", "k0", T0, now) == (3 * 10 * 5, 0)
    assert stores[1].budget_state("key", "k1", T0, now) == (3 * 10 * 5, 0)


def lease(subject: str, spent: int = 0, keep: int = 0, need: int = 0, extra: int = 0, budget: int = 1000,
          scope: str = "team", replica: str = "a", flushed: int = 0) -> LeaseAsk:
    return LeaseAsk(f"lease:{replica}:{scope}:{subject}", scope, subject, T0, budget, spent, flushed, keep,
                    need, extra, time.time() + 60)


def test_a_lease_is_granted_need_plus_at_most_a_quarter_of_what_is_free(store: Store) -> None:
    store.insert_usage([record("old", team="red", cost_picousd=200, ts=T0 + 1)])
    now = time.time()
    assert store.reserve([hold("red", 100)], now) is None
    # free: 1000 - 200 spent - 100 held = 700; need 20 + min(1000, (700 - 20) // 4 = 170)
    assert store.renew_leases([lease("red", need=20, extra=1000)], now) == (0, [LeaseGrant(190, 200)])
    assert store.budget_state("team", "red", T0, now) == (200, 290)
    # the other replica: free 510, so 10 + min(40, 125)
    assert store.renew_leases([lease("red", need=10, extra=40, replica="b")], now) == (
        0, [LeaseGrant(50, 200)])
    # a renewal replaces the lease's hold and moves its spend to the ledger: free = 1000 - 230 - 150 = 620
    assert store.renew_leases([lease("red", spent=30, keep=40, need=60, extra=8)], now) == (
        0, [LeaseGrant(68, 230)])
    assert store.budget_state("team", "red", T0, now) == (230, 100 + 50 + 68)


def test_a_lease_that_does_not_fit_keeps_only_what_is_in_flight_for_every_subject(store: Store) -> None:
    now = time.time()
    assert store.renew_leases([lease("red", need=900), lease("k1", need=5, scope="key")], now) == (
        0, [LeaseGrant(900, 0), LeaseGrant(5, 0)])
    refused, grants = store.renew_leases(
        [lease("k1", spent=5, need=10, extra=50, scope="key"), lease("red", spent=300, keep=100, need=800)],
        now)
    assert refused == 2, "red: 1000 - 300 spent = 700 free < 800"
    assert grants == [LeaseGrant(0, 5), LeaseGrant(100, 300)], "each keeps what is in flight; spend counts"
    assert store.budget_state("team", "red", T0, now) == (300, 100)
    assert store.budget_state("key", "k1", T0, now) == (5, 0)


def test_a_flush_adds_spend_but_never_recreates_a_dropped_ledger(store: Store) -> None:
    now = time.time()
    store.insert_usage([record("u1", team="red", cost_picousd=40, ts=T0 + 1)])
    assert store.renew_leases([lease("red", need=100)], now)[0] == 0
    assert store.renew_leases([lease("red", spent=60, keep=0, need=0, extra=40)], now) == (
        0, [LeaseGrant(40, 100)])
    store.set_limits(LimitRow("team", "red", rpm=5))  # the budget cleared: the ledger goes
    store.set_limits(LimitRow("team", "red", 1000, "month", rpm=5))
    store.renew_leases([lease("red", spent=7)], now)  # a late flush from a replica
    assert store.budget_state("team", "red", T0, now) == (40, 0), "from the usage table, as if new"


def test_a_renewal_applied_again_adds_its_spend_once(store: Store) -> None:
    """The answer to a renewal was lost (the connection cut after the commit): the replica sends it again,
    with what was settled since, and the ledger gets each cost once."""
    now = time.time()
    assert store.renew_leases([lease("red", need=100)], now)[0] == 0
    assert store.renew_leases([lease("red", spent=30, keep=0, need=0, extra=0)], now) == (
        0, [LeaseGrant(0, 30)])
    # the replica did not hear back: it still has the 30 to flush, and 12 more
    assert store.renew_leases([lease("red", spent=42, keep=0, need=0, extra=0)], now) == (
        0, [LeaseGrant(0, 42)])
    assert store.renew_leases([lease("red", spent=5, flushed=42)], now) == (0, [LeaseGrant(0, 47)])
    assert store.budget_state("team", "red", T0, now) == (47, 0)
    assert store.purge_holds(now + 61) == 1, "the lease given back held 0 until it expired"


def test_leases_of_two_replicas_never_grant_more_than_the_budget(make_store: Callable[[], Store]) -> None:
    """Two replicas, 8 threads renewing leases of 10 with extra room while spending all they hold."""
    stores = [make_store(), make_store()]
    stores[0].migrate()
    spent, last = [0] * 8, [0] * 8

    def work(n: int) -> None:
        for _ in range(20):
            refused, (grant,) = stores[n % 2].renew_leases(
                [lease("red", spent=last[n], need=10, extra=30, replica=str(n), flushed=spent[n] - last[n])],
                time.time())
            last[n] = 0 if refused else grant.amount_picousd  # spent whole before the next renewal
            spent[n] += last[n]

    run_all(*[lambda n=n: work(n) for n in range(8)])
    for n in range(8):  # the last slices' spend goes to the ledger, the leases go
        stores[0].renew_leases([lease("red", spent=last[n], replica=str(n), flushed=spent[n] - last[n])],
                               time.time())
    total, held = stores[1].budget_state("team", "red", T0, time.time())
    assert held == 0 and total == sum(spent) and 1000 - 10 < total <= 1000


def test_an_alert_is_marked_once_per_period_and_level(store: Store) -> None:
    assert store.mark_alert("team", "red", T0, "soft", 1.0) is True
    assert store.mark_alert("team", "red", T0, "soft", 2.0) is False
    assert store.mark_alert("team", "red", T0, "hard", 2.0) is True
    assert store.mark_alert("team", "red", T0 + DAY, "soft", 3.0) is True


def test_records_keep_their_attempts_and_account(store: Store) -> None:
    store.insert_usage([record("a-1", attempts=3, account="two"), record("a-2")])
    rows = {r.group["account"]: r.counters["requests"] for r in store.usage_report(ReportQuery("account"))}
    assert rows == {"": 1, "two": 1}


def test_report_filters_by_team_and_key_and_latencies(store: Store) -> None:
    """The dashboard's filters (ReportQuery.team, .key_id) and its latency sample, on both backends."""
    store.insert_usage([
        record("a", ts=T0, latency_ms=10.0, prompt_tokens=1),
        record("b", ts=T0 + 1, key_id="k3", model="deepseek-reasoner", latency_ms=30.0, prompt_tokens=2),
        record("c", ts=T0 + 2, key_id="k3", latency_ms=20.0, prompt_tokens=4),
        record("d", ts=T0 + 3, key_id="k3", outcome="rejected", rule_code="max_tokens", latency_ms=1.0),
    ])
    team = KEYS["k3"][1]
    rows = store.usage_report(ReportQuery("model", team=team))
    assert {r.group["model"]: r.counters["requests"] for r in rows} == {"deepseek-chat": 2,
                                                                       "deepseek-reasoner": 1}
    assert [r.counters["requests"] for r in store.usage_report(ReportQuery("team", key_id="k1"))] == [1]
    assert store.usage_report(ReportQuery("team", T0 + 10, team=team)) == []
    newest_first = store.latencies(ReportQuery("team", key_id="k3"), 10)
    assert newest_first == [("deepseek-chat", 20.0), ("deepseek-reasoner", 30.0)]  # answered only
    assert store.latencies(ReportQuery("team"), 1) == [("deepseek-chat", 20.0)]
