"""Shared fixtures for the proxy tests: a fake DeepSeek, chatgate in front of it, and usage-record polling."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate, settle

JSON_HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-test-client-0001"}


def chat_body(content: str = "What is the capital of France?", **extra: Any) -> dict[str, Any]:
    """A small, valid chat request: one user turn to deepseek-flash."""
    return {"model": "deepseek-flash", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def fake_server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(fake_server: RunningFake) -> Iterator[RunningFake]:
    """The module's fake DeepSeek, with its records cleared and its configuration restored for each test."""
    fake_server.state.reset()
    yield fake_server
    assert fake_server.state.wait_idle(5.0), "a request was still in flight at the fake after the test"
    fake_server.state.reset()


@pytest.fixture
def event_loop_name() -> str:
    """The event loop chatgate runs on: uvloop, as in production; a module overrides this fixture (with
    params) to run its tests on both loops."""
    return "uvloop"


@pytest.fixture
def start_gate(tmp_path: Path, fake: RunningFake, event_loop_name: str
               ) -> Iterator[Callable[..., RunningChatgate]]:
    """Start chatgate (in-process uvicorn) in front of the fake, with per-section setting overrides."""
    stack: list[Any] = []

    def start(upstream_url: str | None = None, transport: Any = None, **sections: dict[str, Any]
              ) -> RunningChatgate:
        settings = make_settings(tmp_path, upstream_url or fake.url, **sections)
        cm = run_chatgate(settings, transport=transport, loop=event_loop_name)
        gate = cm.__enter__()
        stack.append(cm)
        return gate

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


@pytest.fixture
def gate(start_gate: Callable[..., RunningChatgate]) -> RunningChatgate:
    """chatgate with default test settings in front of the fake DeepSeek."""
    return start_gate()


def usage_rows(tmp_path: Path, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Poll the SQLite usage table (the recorder writes off the hot path) until `count` rows are there.

    Returns the rows (oldest first) once there are exactly `count`; waits a little longer to catch extras.
    """
    db = tmp_path / "usage.db"
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = _read_usage(db)
        if len(rows) >= count:
            break
        time.sleep(0.02)
    settle(db)  # a duplicate record would be there by now
    rows = _read_usage(db)
    assert len(rows) == count, f"expected {count} usage record(s), found {len(rows)}: {rows}"
    return rows


def _read_usage(db: Path) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM usage ORDER BY ts, record_id")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
