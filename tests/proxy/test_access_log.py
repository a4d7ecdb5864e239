"""One structured JSON access-log line per request; prompt and completion only with server.log_content."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from tests.harness import RunningChatgate
from tests.proxy.conftest import JSON_HEADERS, chat_body

SECRET_PROMPT = "my-very-private-prompt-text"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "chatgate.access"]


def test_one_json_line_per_request_without_content(
        start_gate: Callable[..., RunningChatgate], caplog: pytest.LogCaptureFixture) -> None:
    gate = start_gate(server={"access_log": True})
    caplog.set_level(logging.INFO, logger="chatgate.access")
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        ok = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT),
                         headers={"x-request-id": "req-ok"})
        bad = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT, n=3),
                          headers={"x-request-id": "req-bad"})
        refused = client.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain",
                                                                                 "x-request-id": "req-415"})
    assert (ok.status_code, bad.status_code, refused.status_code) == (200, 400, 415)
    lines = {line["request_id"]: line for line in access_lines(caplog)}
    assert set(lines) == {"req-ok", "req-bad", "req-415"}
    assert lines["req-ok"]["outcome"] == "ok" and lines["req-ok"]["prompt_tokens"] > 0
    assert {"key_id", "team", "model", "latency_ms", "completion_tokens"} <= set(lines["req-ok"])
    assert lines["req-bad"]["outcome"] == "rejected" and lines["req-bad"]["rule_code"] == "n_not_supported"
    assert lines["req-415"]["status"] == 415
    assert SECRET_PROMPT not in caplog.text
    assert "Answer" not in caplog.text  # the completion text either


def test_log_content_setting_adds_prompt_and_completion(
        start_gate: Callable[..., RunningChatgate], caplog: pytest.LogCaptureFixture) -> None:
    gate = start_gate(server={"access_log": True, "log_content": True})
    caplog.set_level(logging.INFO, logger="chatgate.access")
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT), headers={"x-request-id": "plain"})
        with client.stream("POST", "/v1/chat/completions", json=chat_body(SECRET_PROMPT, stream=True),
                           headers={"x-request-id": "streamed"}) as resp:
            resp.read()
    lines = {line["request_id"]: line for line in access_lines(caplog)}
    for rid in ("plain", "streamed"):
        assert SECRET_PROMPT in lines[rid]["request_body"]
        assert "Answer" in lines[rid]["completion"]
