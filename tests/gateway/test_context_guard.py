"""R40, the optional context-window guard: off by default; on, it warns (header); strict, it rejects.

The window is shrunk through a model profile override so that a small body overflows it."""

from __future__ import annotations

from collections.abc import Callable

import httpx2

from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body
from tests.harness import RunningChatgate

SMALL_WINDOW = {"deepseek-flash": {"context_window": 200}}
LONG = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens, ~1.8 KB


def test_guard_off_by_default_forwards_without_counting(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(models=SMALL_WINDOW)
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(LONG), headers=JSON_HEADERS)
    assert resp.status_code == 200
    assert "x-chatgate-warning" not in resp.headers


def test_guard_on_warns_and_still_forwards(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(models=SMALL_WINDOW, validation={"context_guard": True})
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(LONG, max_tokens=50),
                       headers=JSON_HEADERS)
    assert resp.status_code == 200
    assert "maximum context length is 200 tokens" in resp.headers["x-chatgate-warning"]
    assert len(fake.state.requests) == 1
    dry = httpx2.post(gate.url + "/v1/chat/completions/validate", json=chat_body(LONG), headers=JSON_HEADERS)
    assert dry.json()["valid"] is True
    assert dry.json()["warnings"][0]["code"] == "context_length_exceeded"


def test_guard_leaves_bodies_smaller_than_the_window_alone(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(models={"deepseek-flash": {"context_window": 100_000}},
                      validation={"context_guard": True, "strict": True})
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(LONG), headers=JSON_HEADERS)
    assert resp.status_code == 200 and "x-chatgate-warning" not in resp.headers


def test_guard_in_strict_mode_rejects_before_deepseek(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(models=SMALL_WINDOW, validation={"context_guard": True, "strict": True})
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(LONG), headers=JSON_HEADERS)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    assert resp.json()["error"]["param"] == "messages"
    assert fake.state.requests == []
