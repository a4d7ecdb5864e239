"""One structured JSON access-log line per request; prompt and completion only with server.log_content."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from chatgate.gateway.accesslog import log_formatter, text_line
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

    from chatgate.gateway.accesslog import AccessLog

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


def test_json_lines_carry_an_iso_time_beside_ts(
        start_gate: Callable[..., RunningChatgate], capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True})
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        client.post("/v1/chat/completions", json=chat_body("hi"), headers={"x-request-id": "req-iso"})
    gate.state.gw.ledger.access_log.flush()
    line = {found["request_id"]: found for found in access_lines(capfd)[0]}["req-iso"]
    stamp = dt.datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert abs(stamp.timestamp() - line["ts"]) < 0.001


def test_the_text_format_is_one_readable_line_per_request(
        start_gate: Callable[..., RunningChatgate], capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True, "log_format": "text"})
    with httpx2.Client(base_url=gate.url, headers=JSON_HEADERS) as client:
        ok = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT),
                         headers={"x-request-id": "req-text-ok"})
        bad = client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT, n=3),
                          headers={"x-request-id": "req-text-bad"})
    assert (ok.status_code, bad.status_code) == (200, 400)
    gate.state.gw.ledger.access_log.flush()
    out = capfd.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith("{")], "no JSON lines"
    lines = {line.split(" ")[7]: line for line in out.splitlines() if re.match(r"^\d{4}-\d\d-\d\dT", line)
             and len(line.split(" ")) > 7}
    first = lines["req-text-ok"].split(" ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first[0])
    assert first[1:8] == ["200", "ok", "/v1/chat/completions", "deepseek-flash", "default", first[6],
                          "req-text-ok"]
    assert first[6].startswith("fp-")
    assert re.search(r" prompt_tokens=\d+ ", lines["req-text-ok"])
    assert re.search(r" latency_ms=[\d.]+", lines["req-text-ok"])
    assert lines["req-text-bad"].split(" ")[1:3] == ["400", "rejected"]
    assert " rule_code=n_not_supported" in lines["req-text-bad"]
    assert SECRET_PROMPT not in out


def test_text_lines_quote_what_has_spaces_and_leave_out_what_is_empty() -> None:
    line = text_line({"event": "request", "ts": 1796000000.25, "request_id": "r1", "route": "/v1/x",
                      "status": 429, "outcome": "limited", "code": "a b", "repairs": [], "account": None,
                      "stream": False, "rule_code": "rpm:key", "tokens_exact": True, "extra": {"k": 1}})
    assert line == ('2026-11-30T00:53:20.250Z 429 limited /v1/x r1 code="a b" rule_code=rpm:key '
                    'tokens_exact=true extra={"k":1}')


@pytest.mark.parametrize(("log_format", "pattern"), [
    ("json", r'^\{"event":"log","time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","level":"WARNING",'
             r'"logger":"chatgate.test","message":"a \\"quoted\\" warning"\}$'),
    ("text", r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING chatgate.test: a "quoted" warning$'),
])
def test_the_other_log_lines_take_the_same_form(log_format: str, pattern: str) -> None:
    record = logging.LogRecord("chatgate.test", logging.WARNING, __file__, 1, 'a "quoted" %s', ("warning",),
                               None)
    assert re.match(pattern, log_formatter(log_format).format(record))
