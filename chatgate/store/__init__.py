"""Where client keys and usage records live: SQLite for one machine, PostgreSQL for replicas."""

from __future__ import annotations

from chatgate.store.base import (
    COUNTERS,
    GROUP_BYS,
    OUTCOMES,
    AlertStore,
    ApiKey,
    FileOwnerStore,
    GroupBy,
    KeyStore,
    LimitStore,
    ReportQuery,
    ReportRow,
    Store,
    StoreError,
    StoreRefused,
    TurnStore,
    UsageRecord,
    UsageStore,
)

__all__ = [
    "COUNTERS",
    "GROUP_BYS",
    "OUTCOMES",
    "AlertStore",
    "ApiKey",
    "FileOwnerStore",
    "GroupBy",
    "KeyStore",
    "LimitStore",
    "ReportQuery",
    "ReportRow",
    "Store",
    "StoreError",
    "StoreRefused",
    "TurnStore",
    "UsageRecord",
    "UsageStore",
    "open_store",
]


def open_store(url: str) -> Store:
    """`sqlite:///relative.db`, `sqlite:////abs/path.db`, or `postgresql://user@host:port/db`.

    Nothing is connected yet: the first call (usually migrate()) does that.
    """
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "sqlite":
        return _open_sqlite(url, rest)
    if sep and scheme in ("postgresql", "postgres"):
        from chatgate.store.postgres import PostgresStore  # psycopg is only imported when used

        return PostgresStore(url)
    raise ValueError(
        f"unsupported store URL {_redact(url)!r}: expected sqlite:///path.db or postgresql://user@host:port/db"
    )


def _open_sqlite(url: str, rest: str) -> Store:
    from chatgate.store.sqlite import SQLiteStore

    path = rest[1:] if rest.startswith("/") else ""
    if not path or path == ":memory:":
        raise ValueError(
            f"bad SQLite URL {url!r}: expected sqlite:///relative/path.db or sqlite:////abs/path.db"
        )
    return SQLiteStore(path, url=url)


def _redact(url: str) -> str:
    """The URL without a password, for error messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"
