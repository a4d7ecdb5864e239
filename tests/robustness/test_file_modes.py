"""The SQLite store is only its user's (issue 48, finding 12): chatgate creates the database 0600 (SQLite
gives its -wal and -shm files the same mode) in a directory of its own 0700, as the spool beside it is.
Before: 0644 in a 0755 directory under the usual umask (022)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx2

from chatgate.refusals.store import SQLiteRefusals
from tests.fakes.server import run_fake_deepseek
from tests.harness import make_settings, run_chatgate


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_chatgate_creates_is_its_users_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        data = tmp_path / "data"
        with run_fake_deepseek() as fake, run_chatgate(make_settings(
                tmp_path, fake.url, store={"url": f"sqlite:///{data}/chatgate.db",
                                           "spool_dir": str(data / "spool")})) as gate:
            hi = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
            resp = httpx2.post(gate.url + "/v1/chat/completions", timeout=30, json=hi,
                               headers={"authorization": "Bearer sk-modes-0001"})
            assert resp.status_code == 200
        files = sorted(data.glob("chatgate.db*"))
        assert data / "chatgate.db" in files
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert mode(data) == 0o700
    finally:
        os.umask(old)


def test_the_inspectors_store_alone_creates_it_so_too(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = SQLiteRefusals(str(tmp_path / "own" / "refusals.db"))
        store.migrate()
        store.close()
        assert mode(tmp_path / "own" / "refusals.db") == 0o600 and mode(tmp_path / "own") == 0o700
    finally:
        os.umask(old)


def test_an_existing_directory_is_left_as_it_is(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    store = SQLiteRefusals(str(shared / "r.db"))
    store.migrate()
    store.close()
    assert mode(shared) == 0o755 and mode(shared / "r.db") == 0o600
