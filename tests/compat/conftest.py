"""One real chatgate (passthrough, SQLite) in front of the fake DeepSeek, shared by the compatibility tests.

Every client here runs the same scenario through its own API:
1. a tool-calling loop: the model (thinking by default) calls `search_forecast`, the client runs it and sends
   the assistant turn back *with* its `reasoning_content` (R17), the model answers from the tool result;
2. a streamed answer, relayed chunk by chunk;
3. a broken history, refused by chatgate with a 400 the client raises as its own exception type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.deepseek import FakeState
from tests.fakes.server import run_fake_deepseek
from tests.harness import make_settings, run_chatgate

CLIENT_KEY = "sk-compat-client-0001"
MODEL = "deepseek-flash"  # thinks unless thinking.type = "disabled"

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_forecast",
        "description": "Search the weather forecast.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


def search_forecast(q: str) -> str:
    """The tool every client runs (the fake DeepSeek always calls it with {"q": "x"})."""
    return f"forecast for {q}: light rain"


@dataclass
class Gate:
    url: str  # chatgate root
    fake: FakeState

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
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        yield Gate(gate.url, fake.state)


@pytest.fixture
def gate(gate_server: Gate) -> Gate:
    gate_server.fake.wait_idle(5)
    gate_server.fake.reset()
    return gate_server
