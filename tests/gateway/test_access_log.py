"""One structured JSON access-log line per request; prompt and completion only with server.log_content."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from tests.gateway.conftest import JSON_HEADERS, chat_body
from tests.harness import RunningChatgate

SECRET_PROMPT = "my-very-private-prompt-text"


def access_lines(capfd: pytest.CaptureFixture[str]) -> tuple[list[dict[str, Any]], str]:
    """The JSON lines chatgate wrote to stdout (fd 1), and all of it."""
    out = capfd.readouterr().out
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"event":"request"')], out


def test_one_json_line_per_request_without_content(
        start_gate: Callable[..., RunningChatgate], capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True})
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        ok = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT),
                         headers={"x-request-id": "req-ok"})
        bad = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT, n=3),
                          headers={"x-request-id": "req-bad"})
        refused = client.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain",
                                                                                 "x-request-id": "req-415"})
    assert (ok.status_code, bad.status_code, refused.status_code) == (200, 400, 415)
    gate.state.gw.ledger.access_log.flush()
    found, out = access_lines(capfd)
    lines = {line["request_id"]: line for line in found}
    assert set(lines) == {"req-ok", "req-bad", "req-415"}
    assert lines["req-ok"]["outcome"] == "ok" and lines["req-ok"]["prompt_tokens"] > 0
    assert {"key_id", "team", "model", "latency_ms", "completion_tokens"} <= set(lines["req-ok"])
    assert lines["req-bad"]["outcome"] == "rejected" and lines["req-bad"]["rule_code"] == "n_not_supported"
    assert lines["req-415"]["status"] == 415
    assert SECRET_PROMPT not in out
    assert "Answer" not in out  # the completion text either


def test_log_content_setting_adds_prompt_and_completion(
        start_gate: Callable[..., RunningChatgate], capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True, "log_content": True})
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT), headers={"x-request-id": "plain"})
        with client.stream("POST", "/v1/chat/completions", json=chat_body(SECRET_PROMPT, stream=True),
                           headers={"x-request-id": "streamed"}) as resp:
            resp.read()
    gate.state.gw.ledger.access_log.flush()
    found, _ = access_lines(capfd)
    lines = {line["request_id"]: line for line in found}
    for rid in ("plain", "streamed"):
        assert SECRET_PROMPT in lines[rid]["request_body"]
        assert "Answer" in lines[rid]["completion"]


def test_a_full_stdout_pipe_never_blocks_the_event_loop_and_loses_no_line() -> None:
    """AccessLog keeps what a non-blocking pipe refused for its next flush instead of spinning."""
    import asyncio
    import contextlib
    import fcntl
    import os

    from app.gateway.accesslog import AccessLog

    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    async def scenario() -> bytes:
        log = AccessLog(write_fd)
        for i in range(20_000):  # ~1.3 MB, far more than a pipe holds
            log.write({"i": i, "pad": "x" * 50})
        log.flush()  # returns with the pipe full
        got = b""
        for _ in range(400):
            with contextlib.suppress(BlockingIOError):
                got += os.read(read_fd, 1 << 20)
            if got.count(b"\n") == 20_000:
                break
            await asyncio.sleep(0.06)
        return got

    try:
        got = asyncio.run(scenario())
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert [json.loads(line)["i"] for line in got.splitlines()] == list(range(20_000))
