"""Throw-away PostgreSQL databases for tests.

The server is the one on 127.0.0.1:5432 (trust auth) unless CHATGATE_TEST_PG_URL
names another admin URL. When it cannot be reached the calling test is skipped,
or failed when CI is set.

A test that stops the server itself (test_postgres_restart.py) holds `server_to_itself()`; every throw-away
database holds the same lock shared, so that test waits for the others, and they for it, across parallel
test processes (pytest-xdist workers, other checkouts' runs on the same machine).

A throw-away database is dropped by a thread of its own after the test (a DROP DATABASE waits for the server's
checkpoint: 0.1-1 s a test), with the shared lock held until it is gone; `server_to_itself()` and the end of
the process wait for what is still being dropped.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import queue
import secrets
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.ci import missing

ADMIN_URL = os.environ.get("CHATGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
SERVER_LOCK = Path(tempfile.gettempdir()) / "chatgate-test-postgres.lock"
_held = {"shared": 0, "exclusive": 0}  # by this process: under the exclusive lock its databases need no other
_held_lock = threading.Lock()
_drops: queue.Queue[tuple[str, _SharedLock]] = queue.Queue()  # databases to drop, with the lock each holds
_dropper: list[threading.Thread] = []


class _SharedLock:
    """The shared server lock one throw-away database holds, from its creation until it is dropped."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        with _held_lock:
            exclusive = _held["exclusive"] > 0
        if not exclusive:  # under this process's exclusive lock a database needs no lock of its own
            self._file = open(SERVER_LOCK, "a")  # noqa: SIM115 (held past this block, closed by release)
            fcntl.flock(self._file, fcntl.LOCK_SH)
        with _held_lock:
            _held["shared"] += 1

    def release(self) -> None:
        with _held_lock:
            _held["shared"] -= 1
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


@contextmanager
def _server_to_itself() -> Iterator[None]:
    if _held["exclusive"]:
        yield
        return
    _drops.join()  # what this process dropped after its tests is gone
    if _held["shared"]:
        raise RuntimeError("this process still holds a throw-away database: it would wait for itself")
    with open(SERVER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held["exclusive"] += 1
        try:
            yield
        finally:
            _drops.join()  # the databases made meanwhile are gone before another test may make its own
            _held["exclusive"] -= 1
            fcntl.flock(lock, fcntl.LOCK_UN)


def server_to_itself() -> contextlib.AbstractContextManager[None]:
    """No other test's database exists on the server while this is held (for a test that stops it)."""
    return _server_to_itself()


def admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the admin database, or skip/fail the current test."""
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        missing(f"PostgreSQL not reachable at {ADMIN_URL}: {e}")


def _drop(name: str) -> None:
    with admin_connection() as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _drop_them() -> None:
    while True:
        name, lock = _drops.get()
        try:
            _drop(name)
        except BaseException as exc:  # a database left behind is not the next test's failure
            print(f"tests.pgutil: could not drop the database {name}: {exc!r}", file=sys.stderr)
        finally:
            lock.release()
            _drops.task_done()


def _drop_later(name: str, lock: _SharedLock) -> None:
    if not _dropper:
        _dropper.append(threading.Thread(target=_drop_them, name="pgutil-dropper", daemon=True))
        _dropper[0].start()
        atexit.register(_drops.join)
    _drops.put((name, lock))


def wait_for_drops() -> None:
    """Return once every database dropped in the background is gone (the end of a session calls it: a
    pytest-xdist worker is killed with its controller, before its atexit handlers would run)."""
    _drops.join()


@contextmanager
def fresh_database() -> Iterator[str]:
    """Create an empty database, yield its URL, then drop it (closing whatever is still connected), in the
    background: the next test need not wait for it."""
    name = f"chatgate_t_{secrets.token_hex(6)}"
    lock = _SharedLock()
    try:
        with admin_connection() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except BaseException:
        lock.release()
        raise
    try:
        yield urlsplit(ADMIN_URL)._replace(path=f"/{name}").geturl()
    finally:
        _drop_later(name, lock)
