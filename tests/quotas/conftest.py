"""The quota tests' fake DeepSeek and the chatgate they start in front of it (on a loopback port)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate


@pytest.fixture(scope="module")
def fake_server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(fake_server: RunningFake) -> Iterator[RunningFake]:
    fake_server.state.reset()
    yield fake_server
    assert fake_server.state.wait_idle(10)
    fake_server.state.reset()


@pytest.fixture
def start(tmp_path: Path, fake: RunningFake) -> Iterator[Callable[..., RunningChatgate]]:
    """Start a chatgate in front of `fake`, its store in `tmp_path`, limits re-read at once; `clock`: the time
    it records, prices and limits requests at (`create_app(clock=…)`), the wall clock without one."""
    stack: list[Any] = []

    def run(clock: Callable[[], float] | None = None, **sections: dict[str, Any]) -> RunningChatgate:
        limits = {"cache_seconds": 0, **sections.pop("limits", {})}
        settings = make_settings(tmp_path, fake.url, limits=limits, **sections)
        cm = run_chatgate(settings, clock=clock)
        stack.append(cm)
        return cm.__enter__()

    yield run
    for cm in reversed(stack):
        cm.__exit__(None, None, None)
