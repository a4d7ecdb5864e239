"""The usage writer's failure paths: a record the store refuses, spool truncation, torn spool lines.

A refused record is dropped (it can never be written) but never silently: it is logged whole, counted apart
from the written ones (`chatgate_usage_records_dropped` in /metrics) and /readyz says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx2
import orjson
import pytest

from chatgate.metering.recorder import Recorder, decode, encode, replay_spools
from chatgate.store import open_store
from chatgate.store.base import Store, StoreError, StoreRefused, TurnRow, UsageRecord
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import run_fake_deepseek
from tests.harness import make_settings, run_chatgate
from tests.metering.helpers import chat_body, wait_for


def record(n: int, **changes: object) -> UsageRecord:
    values: dict[str, object] = {
        "record_id": f"rec-{n}", "ts": 1_790_000_000.0 + n, "request_id": f"req-{n}", "key_id": "fp-1",
        "key_name": "fp-1", "team": "default", "model": "deepseek-flash", "route": "/v1/chat/completions",
        "stream": False, "outcome": "ok", "prompt_tokens": n, "completion_tokens": 1}
    values.update(changes)
    return UsageRecord(**values)  # type: ignore[arg-type]


class RefusingStore(SQLiteStore):
    """A SQLite store that refuses the records of one team: with an error that is not a StoreError, or as
    a store refuses a value it cannot hold (StoreRefused: PostgreSQL and a NUL in a text)."""

    def __init__(self, path: Path, error: type[Exception] = ValueError) -> None:
        super().__init__(path)
        self.refused_team = "poison"
        self.error = error

    def _insert_usage(self, conn: sqlite3.Connection, records: Sequence[UsageRecord]) -> None:
        if any(r.team == self.refused_team for r in records):
            raise self.error("value out of range for the usage table")
        super()._insert_usage(conn, records)


def stored_ids(store: Store) -> list[str]:
    assert isinstance(store, SQLiteStore)
    with store._errors():
        rows = store._conn().execute("SELECT request_id FROM usage ORDER BY request_id").fetchall()
    return [r[0] for r in rows]


@contextlib.contextmanager
def recording(store: Store, tmp_path: Path) -> Iterator[Recorder]:
    """A started recorder; on exit, everything fed to it has settled and it has stopped with nothing left."""
    recorder = Recorder(store, str(tmp_path / "spool"), flush_interval=0.005)
    recorder.start()
    try:
        yield recorder
        wait_for(lambda: recorder.pending == 0, 10, "the batch settled")
    finally:
        assert recorder.stop(5)


@pytest.mark.parametrize("error", [ValueError, StoreRefused])
def test_a_refused_record_is_dropped_counted_apart_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, error: type[Exception]) -> None:
    """Never retried as if the store were down: the others would wait behind it for ever."""
    store = RefusingStore(tmp_path / "usage.db", error)
    store.migrate()
    with caplog.at_level(logging.ERROR, "chatgate.recorder"), recording(store, tmp_path) as recorder:
        for n in range(5):
            recorder.record(record(n, team="poison" if n == 2 else "default"))
    assert (recorder.written, recorder.dropped) == (4, 1)
    assert stored_ids(store) == ["req-0", "req-1", "req-3", "req-4"]
    assert '"request_id":"req-2"' in caplog.text, "the dropped record is logged whole"
    store.close()


def test_metrics_and_readiness_say_when_records_were_dropped(tmp_path: Path) -> None:
    store = RefusingStore(tmp_path / "usage.db")
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp_path, fake.url), store=store) as gate:
        assert httpx2.get(gate.url + "/readyz").status_code == 200
        headers = {"authorization": "Bearer sk-a"}
        for n in range(2):
            resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(n), headers=headers)
            assert resp.status_code == 200, resp.text
        recorder = gate.state.recorder
        wait_for(lambda: recorder.pending == 0, 10, "records written")
        metrics = httpx2.get(gate.url + "/metrics").text
        assert "chatgate_usage_records_written_total 2.0" in metrics
        assert "chatgate_usage_records_dropped_total 0.0" in metrics
        store.refused_team = "default"  # the store now refuses this team's records
        assert httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(2),
                           headers=headers).status_code == 200
        wait_for(lambda: recorder.dropped == 1, 10, "the record dropped")
        metrics = httpx2.get(gate.url + "/metrics").text
        assert "chatgate_usage_records_dropped_total 1.0" in metrics
        assert "chatgate_usage_records_written_total 2.0" in metrics
        assert "chatgate_usage_records_spooled 0.0" in metrics
        ready = httpx2.get(gate.url + "/readyz")
        assert ready.status_code == 503
        assert "refused 1 record(s)" in " ".join(ready.json()["problems"])


def test_the_spool_is_truncated_once_everything_in_it_is_stored(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    recorder = Recorder(store, str(spool), flush_interval=0.005, truncate_at=4096)
    recorder.start()
    try:
        (path,) = spool.glob("spool-*.jsonl")
        line = len(encode(record(0)))
        for n in range(4096 // line + 2):
            recorder.record(record(n))
        assert path.stat().st_size > 4096, "spooled at once, before any write to the store"
        wait_for(lambda: recorder.pending == 0 and path.stat().st_size == 0, 10, "the spool truncated")
        recorder.record(record(1000))
        assert path.stat().st_size == len(encode(record(1000))), "appends go on after a truncation"
    finally:
        assert recorder.stop(5)
    assert len(stored_ids(store)) == 4096 // line + 3
    store.close()


def test_the_spool_is_kept_while_records_in_it_are_not_stored(tmp_path: Path) -> None:
    store = RefusingStore(tmp_path / "usage.db")
    store.migrate()
    recorder = Recorder(store, str(tmp_path / "spool"), flush_interval=0.005, truncate_at=0)
    store.close()  # every write now fails with a StoreError: records stay pending and spooled
    recorder.start()
    try:
        recorder.record(record(1))
        time.sleep(0.2)
        (path,) = (tmp_path / "spool").glob("spool-*.jsonl")
        assert recorder.pending == 1 and path.stat().st_size > 0
        assert not recorder.healthy
    finally:
        assert not recorder.stop(0.5)


def test_torn_and_foreign_spool_lines_are_skipped_on_replay(tmp_path: Path) -> None:
    """A crash mid-write leaves a torn last line; lines that are not usage records are skipped too."""
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    tag = Recorder(store, str(tmp_path / "spool"))._tag
    spool = tmp_path / "spool"
    spool.mkdir()
    good = [encode(record(n)) for n in range(3)]
    torn = encode(record(3))[:40]
    foreign = orjson.dumps({"record_id": "x", "unexpected": 1}) + b"\n"
    (spool / f"spool-{tag}-999999-deadbeef.jsonl").write_bytes(good[0] + foreign + good[1] + b"\n" + good[2]
                                                                + torn)
    assert decode(torn) is None and decode(foreign.strip()) is None and decode(b"") is None
    assert decode(good[0].strip()) == record(0)
    replay_spools(store, str(spool))
    assert stored_ids(store) == ["req-0", "req-1", "req-2"]
    assert list(spool.iterdir()) == [], "a replayed spool file is removed"
    store.close()


def test_a_spool_held_by_a_live_process_is_not_replayed(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    live = Recorder(store, str(tmp_path / "spool"), flush_interval=1.0)
    live.start()
    try:
        live.record(record(7))  # spooled; the writer waits a second to gather a batch: not stored yet
        replay_spools(store, str(tmp_path / "spool"))
        assert stored_ids(store) == []
        assert os.path.getsize(live._path) > 0
    finally:
        live.stop(5)
    assert stored_ids(store) == ["req-7"]
    store.close()


def test_an_unnamed_empty_spool_a_kill_left_is_removed_and_a_new_one_is_not(tmp_path: Path) -> None:
    """`kill -9` between creating a spool file and naming it leaves an empty `.tmp-spool-…`: the next start
    removes it, unless it is young enough to be another starting process's."""
    from chatgate.metering.recorder import store_tag

    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    spool.mkdir()
    tag = store_tag(store)
    old, young = spool / f".tmp-spool-{tag}-41-0badf00d.jsonl", spool / f".tmp-spool-{tag}-42-5ca1ab1e.jsonl"
    other = spool / ".tmp-spool-0123456789ab-43-deadbeef.jsonl"  # another store's: not this one's to judge
    for path in (old, young, other):
        path.touch()
    an_hour_ago = time.time() - 3600
    for path in (old, other):
        os.utime(path, (an_hour_ago, an_hour_ago))
    recorder = Recorder(store, str(spool))
    recorder.start()
    try:
        assert not old.exists() and young.exists() and other.exists()
    finally:
        recorder.stop(5)
    store.close()


def turn_row(n: int, expires_at: float = 4_000_000_000.0, payload: str = "secret reasoning") -> TurnRow:
    return TurnRow("fp-1", "chat", f"call-{n}", f"turn-{n}", "read_file", payload, expires_at)


def old_turn_line(row: TurnRow) -> bytes:
    """A relayed turn's spool line as versions before the turn cache's ring file wrote them."""
    return orjson.dumps({"turn": [row.caller, row.kind, row.call_id, row.turn, row.names, row.payload,
                                  row.expires_at]}, option=orjson.OPT_APPEND_NEWLINE)


def test_turns_an_earlier_version_spooled_are_in_the_store_when_start_returns(tmp_path: Path) -> None:
    """A spool an earlier version left (it spooled relayed turns too): the next process replays them before
    it serves anything, so the client's next round is restored (expired turns are not brought back)."""
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    spool.mkdir()
    tag = Recorder(store, str(spool))._tag
    (spool / f"spool-{tag}-999999-deadbeef.jsonl").write_bytes(
        encode(record(1)) + old_turn_line(turn_row(1)) + old_turn_line(turn_row(2, expires_at=1.0))
        + old_turn_line(turn_row(3))[:30])
    assert decode(old_turn_line(turn_row(1)).strip()) == turn_row(1)
    recorder = Recorder(store, str(spool), flush_interval=1.0)  # its writer would wait: only start() replays
    recorder.start()
    try:
        assert [r.call_id for r in store.recall_turns("fp-1", "chat", ["call-1", "call-2", "call-3"], 0)] \
            == ["call-1"]
        assert stored_ids(store) == ["req-1"]
    finally:
        recorder.stop(5)
    store.close()


def test_a_replayed_line_the_store_refuses_is_dropped_and_the_rest_replayed(tmp_path: Path) -> None:
    store = RefusingStore(tmp_path / "usage.db", StoreRefused)
    store.migrate()
    spool = tmp_path / "spool"
    spool.mkdir()
    orphan = spool / f"spool-{Recorder(store, str(spool))._tag}-999999-deadbeef.jsonl"
    orphan.write_bytes(b"".join(encode(record(n, team="poison" if n == 3 else "default")) for n in range(5)))
    recorder = Recorder(store, str(spool))
    recorder.start()
    try:
        assert stored_ids(store) == ["req-0", "req-1", "req-2", "req-4"]
        assert recorder.dropped == 1 and not orphan.exists() and recorder.last_error is None
    finally:
        recorder.stop(5)
    store.close()


class TurnRefusingStore(SQLiteStore):
    def _insert_turns(self, conn: sqlite3.Connection, rows: Sequence[TurnRow]) -> None:
        raise StoreRefused("value too long for the turn table")


def test_a_replayed_turn_the_store_refuses_is_dropped_and_its_reasoning_never_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = TurnRefusingStore(tmp_path / "usage.db")
    store.migrate()
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / f"spool-{Recorder(store, str(spool))._tag}-999999-deadbeef.jsonl").write_bytes(
        encode(record(1)) + old_turn_line(turn_row(1, payload="the private chain of thought")))
    with caplog.at_level(logging.ERROR, "chatgate.recorder"), recording(store, tmp_path):
        pass
    assert "call-1" in caplog.text and "private chain of thought" not in caplog.text
    assert stored_ids(store) == ["req-1"], "the usage record is not held up"
    store.close()


# --- a starting recorder and another process's replay ------------------------------------------------------


def run_when_start_locks_its_spool(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[int], None]) -> None:
    """Run `meanwhile(fd)` when the recorder being started locks its new spool file (fd): between the file's
    creation and its lock, where another process may be replaying orphans."""
    real_flock = fcntl.flock
    called = False

    def flock(fd: int, operation: int) -> None:
        nonlocal called
        if not called:
            called = True
            meanwhile(fd)
        real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock)


def test_a_replay_while_a_recorder_starts_leaves_its_new_spool_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay must not take the new spool file for an orphan and remove it: the recorder would append
    to an unlinked file, and its records would not survive a kill -9."""
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    run_when_start_locks_its_spool(monkeypatch, lambda fd: replay_spools(store, str(spool)))
    live = Recorder(store, str(spool), flush_interval=1.0)
    live.start()
    try:
        live.record(record(1))
        assert [p.name for p in spool.glob("spool-*.jsonl")] == [live._path.name]
        assert os.stat(live._path).st_ino == os.fstat(live._fd).st_ino
        assert live._path.read_bytes() == encode(record(1)), "what a kill -9 leaves for the next start"
    finally:
        assert live.stop(5)
    assert stored_ids(store) == ["req-1"]
    store.close()


def test_a_replay_holding_a_lock_while_a_recorder_starts_does_not_fail_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay reading the spool files it could lock when the recorder locks its new one: the recorder's
    file must not be among them (its lock would be refused: BlockingIOError out of start)."""
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    real_flock, real_read_bytes = fcntl.flock, Path.read_bytes
    refused: list[OSError] = []

    def replay_reading(fd: int) -> None:
        def read_bytes(path: Path) -> bytes:  # the replay holds this file's lock: the recorder locks now
            try:
                real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                refused.append(exc)
            return real_read_bytes(path)
        with monkeypatch.context() as patch:
            patch.setattr(Path, "read_bytes", read_bytes)
            replay_spools(store, str(spool))

    run_when_start_locks_its_spool(monkeypatch, replay_reading)
    live = Recorder(store, str(spool), flush_interval=0.005)
    live.start()
    try:
        assert refused == []
        live.record(record(1))
        assert live._path.read_bytes() == encode(record(1))
    finally:
        assert live.stop(5)
    assert stored_ids(store) == ["req-1"]
    store.close()


def test_a_spool_removed_before_the_replay_locks_it_is_skipped(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the replay's open and its lock, the file's owner stops cleanly (or another replay finishes
    it): both remove the file. The replay then holds the lock of a file no longer there: it skips it, and
    this is no store error."""
    store = open_store(f"sqlite:///{tmp_path / 'usage.db'}")
    store.migrate()
    spool = tmp_path / "spool"
    owner = Recorder(store, str(spool), flush_interval=0.005)
    owner.start()
    owner.record(record(1))
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        assert owner.stop(5)  # its file is the only one in the spool directory
        real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock)
    replayer = Recorder(store, str(spool))
    replayer._replay_orphans()
    assert replayer.last_error is None and not replayer._orphans_left
    assert stored_ids(store) == ["req-1"] and list(spool.iterdir()) == []
    store.close()


class DownStore(SQLiteStore):
    """A SQLite store that is unreachable while `down` is set (every write raises a StoreError)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreError("connection refused")

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        self._check()
        super().insert_usage(records)



def test_a_long_outage_keeps_a_bounded_queue_and_the_spool_fills_the_gap(tmp_path: Path) -> None:
    """Memory does not grow with the outage: past `queue_max` items the spool alone holds them, and the
    writer reads them back from it once the store is back; each is stored once."""
    store = DownStore(tmp_path / "usage.db")
    store.migrate()
    recorder = Recorder(store, str(tmp_path / "spool"), flush_interval=0.005, retry_seconds=0.02,
                        truncate_at=0, queue_max=5)
    recorder.start()
    try:
        store.down = True
        for n in range(40):
            recorder.record(record(n))
        wait_for(lambda: not recorder.healthy, 5, "the outage noticed")
        assert recorder.pending == 40
        assert len(recorder._queued) <= 5, "the queue is bounded"
        store.down = False
        recorder.record(record(40))  # after the outage: queued again
        wait_for(lambda: recorder.pending == 0, 10, "everything stored")
        assert stored_ids(store) == sorted(f"req-{n}" for n in range(41))
        (path,) = (tmp_path / "spool").glob("spool-*.jsonl")
        assert path.stat().st_size == 0, "truncated once all is stored"
    finally:
        assert recorder.stop(5)
    store.close()


class SlowStore(SQLiteStore):
    """A SQLite store whose usage inserts wait until `go` is set (a PostgreSQL insert taking its time)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.go = threading.Event()
        self.waiting = threading.Event()

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        self.waiting.set()
        self.go.wait(10)
        super().insert_usage(records)


def test_a_stop_that_times_out_leaves_the_spool_to_the_writer_still_at_work(tmp_path: Path) -> None:
    """The writer is still in a store call when stop() gives up: the spool stays open for it (closing it
    would let a later file reuse the descriptor that the writer then truncates)."""
    store = SlowStore(tmp_path / "usage.db")
    store.migrate()
    recorder = Recorder(store, str(tmp_path / "spool"), flush_interval=0.005, truncate_at=0)
    recorder.start()
    recorder.record(record(1))
    assert store.waiting.wait(5)
    fd = recorder._fd
    assert not recorder.stop(0.05)
    os.fstat(fd)  # still open
    store.go.set()
    assert recorder._thread is not None
    recorder._thread.join(5)
    assert not recorder._thread.is_alive() and recorder.pending == 0 and recorder.written == 1
    store.close()


def test_readiness_names_the_stores_failure_but_not_its_text(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """/readyz answers anyone: the store's own error text (a host, a port, a user name) is in the log only."""
    secret = 'password authentication failed for user "chatgate" at db.internal:5432'

    class LeakyStore(DownStore):
        def _check(self) -> None:
            if self.down:
                raise StoreError(secret)

    store = LeakyStore(tmp_path / "usage.db")
    store.migrate()
    recorder = Recorder(store, str(tmp_path / "spool"), flush_interval=0.005, retry_seconds=0.02)
    recorder.start()
    try:
        store.down = True
        with caplog.at_level(logging.WARNING, "chatgate.recorder"):
            recorder.record(record(1))
            wait_for(lambda: not recorder.healthy, 5, "the outage noticed")
        assert recorder.last_error == "usage store unavailable: StoreError (details in the log)"
        assert secret in caplog.text
    finally:
        store.down = False
        wait_for(lambda: recorder.healthy and recorder.pending == 0, 10, "the record stored")
        assert recorder.stop(5)
    store.close()
