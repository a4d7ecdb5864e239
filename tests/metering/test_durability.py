"""kill -9 durability: a usage record is spooled before the client sees the end of its response, so a
crash right after (or during) traffic loses nothing and a restart doubles nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.metering.helpers import chat_body, complete, send_chat, sqlite_request_ids, wait_for

pytestmark = pytest.mark.slow  # chatgate processes killed and restarted


def restart_and_collect(tmp_path: Path, upstream: str, db: Path, expected: int) -> list[str]:
    """Start chatgate again on the same SQLite file and spool dir; it replays the dead process's spool."""
    args = ("--upstream", upstream, "--store", f"sqlite:///{db}")
    with spawn_chatgate(tmp_path, *args, name="restarted") as cg:
        wait_for(lambda: len(set(sqlite_request_ids(db))) >= expected,
                 what=f"{expected} records after restart")
        ready = httpx2.get(cg.url + "/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["spooled_records"] == 0
        assert cg.terminate() == 0
    return sqlite_request_ids(db)


def test_kill9_right_after_the_last_response_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """40 requests (streaming and not, 24 of them 4-way concurrent), kill -9 as soon as the last response
    ends: after a restart on the same store and spool there are exactly the 40 request ids, once each."""
    db = tmp_path / "usage.db"
    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}") as cg:
            sent = [complete(cg.url, i, stream=i % 2 == 0, rid=f"seq-{i}") for i in range(16)]
            with ThreadPoolExecutor(4) as pool:
                sent += pool.map(lambda i: complete(cg.url, i, stream=i % 3 == 0, rid=f"par-{i}"), range(24))
            cg.kill9()  # no graceful shutdown: whatever the writer thread had not stored yet is only spooled
        assert fake.state.wait_idle(5)
        ids = restart_and_collect(tmp_path, fake.url, db, len(sent))
    assert len(sent) == 40
    assert Counter(ids) == Counter(sent), "missing or duplicated usage records after kill -9"
    assert list(tmp_path.joinpath("spool").glob("spool-*.jsonl")) == [], "replayed spool files are removed"


def test_kill9_before_a_non_streaming_answer_is_sent_keeps_its_record(tmp_path: Path) -> None:
    """The window the promise is about, made wide: a test build of chatgate pauses after the usage record and
    before the first byte of a non-streaming answer. kill -9 during the pause: the client never got its
    answer, yet after a restart its record is there (it was spooled first). Recording after the send, as
    chatgate once did, loses it; that window, narrow in production, made the test above fail once."""
    db = tmp_path / "usage.db"
    paused = tmp_path / "paused"
    env = {"PAUSEBUILD_SEND_PAUSE": "30", "PAUSEBUILD_PAUSED_FILE": str(paused)}
    outcome: dict[str, object] = {}

    def call(url: str) -> None:
        try:
            outcome["response"] = send_chat(url, chat_body(1), request_id="paused-1", timeout=60)
        except httpx2.TransportError as exc:
            outcome["error"] = exc

    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}", env=env,
                            module="tests.pausebuild") as cg:
            client = threading.Thread(target=call, args=(cg.url,))
            client.start()
            wait_for(paused.exists, what="the pause before the answer is sent")
            cg.kill9()
            client.join(15)
        assert "error" in outcome and "response" not in outcome, "the client must not have its answer"
        assert fake.state.requests[0].outcome == "completed", "DeepSeek answered before the kill"
        ids = restart_and_collect(tmp_path, fake.url, db, 1)
    assert ids == ["paused-1"]


def test_kill9_under_concurrent_load_keeps_every_completed_request(tmp_path: Path) -> None:
    """Crash safety: kill -9 while 6 clients stream and post. Every request whose client got the complete
    response has exactly one record after restart; cut-off requests have at most one; the store opens."""
    db = tmp_path / "usage.db"
    completed: list[str] = []
    attempted: list[str] = []
    stop = threading.Event()

    def client(worker: int, url: str) -> None:
        n = 0
        while not stop.is_set():
            rid, stream = f"w{worker}-{n}", (worker + n) % 2 == 0
            attempted.append(rid)
            n += 1
            try:
                resp = send_chat(url, chat_body(n, stream), f"sk-worker-{worker % 2}", rid,
                                 headers={"x-fake-chunk-delay": "0.01"}, timeout=10)
            except httpx2.TransportError:
                continue  # the kill cut this one off
            if stream and not resp.text.rstrip().endswith("data: [DONE]"):
                continue  # cut mid-stream: the client did not get the complete response
            if resp.status_code == 200:
                completed.append(rid)

    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}") as cg:
            threads = [threading.Thread(target=client, args=(w, cg.url)) for w in range(6)]
            for t in threads:
                t.start()
            wait_for(lambda: len(completed) >= 60, what="60 completed requests before the kill")
            cg.kill9()
            stop.set()
            for t in threads:
                t.join(15)
        done = list(completed)
        ids = restart_and_collect(tmp_path, fake.url, db, len(done))
    counts = Counter(ids)
    assert [rid for rid in done if counts[rid] != 1] == [], "completed requests without exactly one record"
    assert max(counts.values()) == 1, "a record was stored twice"
    assert set(counts) <= set(attempted)
    assert len(done) >= 60


def test_kill9_with_records_only_in_the_spool(tmp_path: Path) -> None:
    """The writer thread never got to the store (SQLite locked by another process the whole time): the
    records exist only in the spool; kill -9, unlock, restart: all of them are written once."""
    import sqlite3

    db = tmp_path / "usage.db"
    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}") as cg:
            complete(cg.url, 0, stream=False, rid="before-lock")
            wait_for(lambda: sqlite_request_ids(db) == ["before-lock"], what="first record stored")
            blocker = sqlite3.connect(db, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")  # the store's writes now fail with "database is locked"
            try:
                sent = [complete(cg.url, i, stream=i % 2 == 1, rid=f"locked-{i}") for i in range(10)]
                spool = "".join(p.read_text() for p in tmp_path.joinpath("spool").glob("spool-*.jsonl"))
                assert all(f'"request_id":"{rid}"' in spool for rid in sent), "records are spooled at once"
                assert sqlite_request_ids(db) == ["before-lock"], "nothing reached the locked store"
                cg.kill9()
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
        time.sleep(0.05)
        ids = restart_and_collect(tmp_path, fake.url, db, 11)
    assert Counter(ids) == Counter(["before-lock", *sent])


def test_usage_cli_replays_a_dead_process_spool_only_into_its_own_store(tmp_path: Path) -> None:
    """Records spooled for store A (A was locked, then chatgate was killed) must not land in store B when
    `chatgate usage --store B` shares the spool directory; `chatgate usage --store A` writes them once."""
    import sqlite3

    from tests.metering.helpers import usage_json

    db_a, db_b = tmp_path / "a.db", tmp_path / "b.db"
    spool_env = {"CHATGATE_STORE_SPOOL_DIR": str(tmp_path / "spool")}
    with run_fake_deepseek() as fake, \
            spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db_a}") as cg:
        blocker = sqlite3.connect(db_a, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            sent = [complete(cg.url, i, stream=i == 1, rid=f"for-a-{i}") for i in range(3)]
            cg.kill9()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    from chatgate.store.sqlite import SQLiteStore

    store_b = SQLiteStore(db_b)  # a report reads a store that exists (it never creates one)
    store_b.migrate()
    store_b.close()
    assert usage_json(f"sqlite:///{db_b}", "key", env=spool_env)["totals"]["requests"] == 0
    assert list(tmp_path.joinpath("spool").glob("spool-*.jsonl")), "A's spool is still waiting for A"
    report = usage_json(f"sqlite:///{db_a}", "key", env=spool_env)
    assert report["totals"]["requests"] == 3
    assert Counter(sqlite_request_ids(db_a)) == Counter(sent)
    assert list(tmp_path.joinpath("spool").glob("spool-*.jsonl")) == []
