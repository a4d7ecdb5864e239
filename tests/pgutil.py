"""Throw-away PostgreSQL databases for tests.

The server is the one on 127.0.0.1:5432 (trust auth) unless CHATGATE_TEST_PG_URL
names another admin URL. When it cannot be reached the calling test is skipped,
or failed when CI is set.

A test that stops the server itself (test_postgres_restart.py) holds `server_to_itself()`; every throw-away
database holds the same lock shared, so that test waits for the others, and they for it, across parallel
test processes (pytest-xdist workers, other checkouts' runs on the same machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.ci import missing

ADMIN_URL = os.environ.get("CHATGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
SERVER_LOCK = Path(tempfile.gettempdir()) / "chatgate-test-postgres.lock"
_held = {"shared": 0, "exclusive": 0}  # by this process: under the exclusive lock its databases need no other


@contextmanager
def _server_lock(mode: str) -> Iterator[None]:
    if _held["exclusive"]:
        yield
        return
    if mode == "exclusive" and _held["shared"]:
        raise RuntimeError("this process still holds a throw-away database: it would wait for itself")
    with open(SERVER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
        _held[mode] += 1
        try:
            yield
        finally:
            _held[mode] -= 1
            fcntl.flock(lock, fcntl.LOCK_UN)


def server_to_itself() -> contextlib.AbstractContextManager[None]:
    """No other test's database exists on the server while this is held (for a test that stops it)."""
    return _server_lock("exclusive")


def admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the admin database, or skip/fail the current test."""
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        missing(f"PostgreSQL not reachable at {ADMIN_URL}: {e}")


@contextmanager
def fresh_database() -> Iterator[str]:
    """Create an empty database, yield its URL, then drop it (closing whatever is still connected)."""
    name = f"chatgate_t_{secrets.token_hex(6)}"
    with _server_lock("shared"):
        with admin_connection() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield urlsplit(ADMIN_URL)._replace(path=f"/{name}").geturl()
        finally:
            with admin_connection() as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
