"""Suite-wide set-up: a data directory of the run's own (the default store's place), pytest-xdist workers
die with the run that started them (tests/lifeline.py), the HTTP clients of a test process share one
default SSL context (`_one_ssl_context`), and a session ends once its throw-away PostgreSQL databases are
dropped (tests/pgutil.py)."""

from __future__ import annotations

import os
import ssl
import sys
import tempfile
from collections.abc import Callable
from types import ModuleType
from typing import Any

import httpx._transports.default
import httpx2._transports.default
import pytest

from tests import lifeline

# chatgate's default store is in the per-user data directory: a test (or a process it starts) that sets no
# store gets this process's own, never the user's ~/.local/share/chatgate
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="chatgate-tests-data-")


def _one_ssl_context(transports: ModuleType) -> None:
    """Every httpx / httpx2 client (each `httpx2.get(…)`, each openai or anthropic SDK client) loads the CA
    bundle into an SSLContext of its own: ~26 ms of CPU, for clients that talk plain HTTP to 127.0.0.1 (in
    tests/web alone 265 of them, 8.6 of its 12 s of CPU). The default context (verify=True, no client cert)
    is made once per process and trust settings (`trust_env`, SSL_CERT_FILE, SSL_CERT_DIR) instead; any other
    `verify` or a `cert` is built as the library builds it."""
    create: Callable[..., ssl.SSLContext] = transports.create_ssl_context
    made: dict[tuple[Any, ...], ssl.SSLContext] = {}

    def shared(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return create(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if key not in made:
            made[key] = create(verify=verify, cert=cert, trust_env=trust_env)
        return made[key]

    transports.create_ssl_context = shared


_one_ssl_context(httpx._transports.default)
_one_ssl_context(httpx2._transports.default)


def pytest_sessionfinish(session: pytest.Session) -> None:
    pgutil = sys.modules.get("tests.pgutil")
    if pgutil is not None:  # before a worker reports its end (then it may be killed with its controller)
        pgutil.wait_for_drops()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller is its parent
        lifeline.die_with_parent_now(os.getppid())
