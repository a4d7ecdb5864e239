"""Throw-away PostgreSQL databases for tests.

The server is the one on 127.0.0.1:5432 (trust auth) unless CHATGATE_TEST_PG_URL
names another admin URL. When it cannot be reached the calling test is skipped,
or failed when CI is set.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.ci import missing

ADMIN_URL = os.environ.get("CHATGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


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
    with admin_connection() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(ADMIN_URL)._replace(path=f"/{name}").geturl()
    finally:
        with admin_connection() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
