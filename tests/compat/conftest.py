"""One real chatgate (passthrough, SQLite) in front of the fake DeepSeek, shared by the compatibility tests.

The per-client tests run the same scenario through each client's own API:
1. a tool-calling loop: the model (thinking by default) calls `search_forecast`, the client runs it and sends
   the assistant turn back *with* its `reasoning_content` (R17), the model answers from the tool result;
2. a streamed answer, relayed chunk by chunk;
3. a broken history, refused by chatgate with a 400 the client raises as its own exception type.

The zoo (test_zoo.py, tests/compat/zoo/) runs every client library through tool loops with thinking on and
off, streaming and not; chatgate is wrapped in a recorder of what the clients send it (`Gate.recorder`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chatgate.demo.deepseek import FakeState
from tests.compat.zoo.model import CLIENT_KEY, MODEL
from tests.compat.zoo.model import TOOL_SCHEMA as SEARCH_TOOL
from tests.compat.zoo.model import forecast as search_forecast
from tests.compat.zoo.recorder import Recorder
from tests.compat.zoo.runner import Zoo
from tests.fakes.server import run_fake_deepseek
from tests.harness import make_settings, run_chatgate

__all__ = ["CLIENT_KEY", "MODEL", "SEARCH_TOOL", "Gate", "search_forecast"]


@dataclass
class Gate:
    url: str  # chatgate root
    fake: FakeState
    fake_url: str
    recorder: Recorder  # every request clients sent to chatgate, byte for byte

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def upstream_bodies(self) -> list[dict[str, Any]]:
        """Chat bodies that reached the fake DeepSeek, oldest first."""
        self.fake.wait_idle(5)
        return [json.loads(r.body) for r in self.fake.requests if r.path.endswith("/chat/completions")]


@pytest.fixture(scope="package")
def gate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    tmp: Path = tmp_path_factory.mktemp("compat")
    recorder = Recorder()
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url), wrap=recorder.wrap) as gate:
        yield Gate(gate.url, fake.state, fake.url, recorder)


@pytest.fixture
def gate(gate_server: Gate) -> Gate:
    gate_server.fake.wait_idle(5)
    gate_server.fake.reset()
    return gate_server


@pytest.fixture(scope="package")
def zoo(gate_server: Gate) -> Zoo:
    """Each client's zoo scenarios, run once on first use (default validation settings, passthrough auth)."""
    return Zoo(gate_server.url, gate_server.fake_url, gate_server.fake, gate_server.recorder)
