"""Each retry rule of issue 35 that tests/gateway/test_retries.py does not already cover, end to end: the
openai SDK (its own retries off) and the anthropic SDK -> chatgate on a loopback port -> the fake DeepSeek,
whose faults apply to the first N attempts of a request (docs/retries.md)."""

from __future__ import annotations

import email.utils
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body, usage_rows
from tests.gateway.test_retries import MESSAGES, RETRYING, attempts_of, faults, pieces, stream_text
from tests.harness import RunningChatgate


@pytest.fixture
def gate(start_gate: Callable[..., RunningChatgate]) -> RunningChatgate:
    return start_gate(upstream=RETRYING)


@pytest.fixture
def sdk(gate: RunningChatgate) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-retry-rules", max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture
def claude(gate: RunningChatgate) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key="sk-retry-rules", max_retries=0,
                             timeout=20) as c:
        yield c


def metric(gate: RunningChatgate, line: str) -> float:
    """The value of one sample of /metrics (0 when it is absent)."""
    for row in httpx2.get(gate.url + "/metrics").text.splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


# ---------------------------------------------------------------------------- what is retried, what not


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_each_retry_status_is_retried_and_its_record_says_the_attempts(
        sdk: openai.OpenAI, gate: RunningChatgate, fake: RunningFake, tmp_path: Path, status: int) -> None:
    rid, headers = faults(f"http_{status}", 1)
    raw = sdk.chat.completions.with_raw_response.create(model="deepseek-flash", messages=MESSAGES,
                                                          extra_headers=headers)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-chatgate-attempts"] == "2"
    assert [r.status for r in attempts_of(fake, rid)] == [status, 200]
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["upstream_status"], row["attempts"]) == ("ok", 200, 2)
    assert metric(gate, f'chatgate_upstream_retries_total{{reason="{status}"}}') == 1
    assert metric(gate, f'chatgate_upstream_attempts_total{{account="caller",status="{status}"}}') == 1
    assert metric(gate, 'chatgate_upstream_attempts_total{account="caller",status="200"}') == 1


@pytest.mark.parametrize(("name", "status"), [("http_403", 403), ("http_404", 404), ("http_413", 413)])
def test_403_404_413_are_not_retried(gate: RunningChatgate, fake: RunningFake, tmp_path: Path, name: str,
                                     status: int) -> None:
    rid, headers = faults(name, 5)
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(),
                       headers={**JSON_HEADERS, **headers})
    assert resp.status_code == status
    assert len(attempts_of(fake, rid)) == 1
    assert "x-should-retry" not in resp.headers and "x-chatgate-attempts" not in resp.headers
    (row,) = usage_rows(tmp_path, 1)
    assert row["attempts"] == 1


def test_content_exists_risk_is_not_retried_through_either_sdk(
        sdk: openai.OpenAI, claude: anthropic.Anthropic, fake: RunningFake) -> None:
    rid, headers = faults("http_400", 5)
    with pytest.raises(openai.BadRequestError, match="Content Exists Risk"):
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    assert len(attempts_of(fake, rid)) == 1
    rid, headers = faults("http_400", 5)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES,
                               extra_headers=headers)
    assert len(attempts_of(fake, rid)) == 1


def test_retries_0_turns_retrying_off(start_gate: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start_gate(upstream={**RETRYING, "retries": 0})
    rid, headers = faults("http_503", 1)
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(),
                       headers={**JSON_HEADERS, **headers})
    assert resp.status_code == 503
    assert "x-should-retry" not in resp.headers and "chatgate made" not in resp.text  # DeepSeek's, as it came
    assert len(attempts_of(fake, rid)) == 1


def test_a_first_byte_timeout_is_retried(start_gate: Callable[..., RunningChatgate], fake: RunningFake,
                                         tmp_path: Path) -> None:
    gate = start_gate(upstream={**RETRYING, "read_timeout": 0.5})
    rid, headers = faults("no_headers", 1, **{"x-fake-delay": "3"})
    t0 = time.monotonic()
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(),
                       headers={**JSON_HEADERS, **headers}, timeout=20)
    assert resp.status_code == 200, resp.text
    assert 0.45 < time.monotonic() - t0 < 2.5
    assert resp.headers["x-chatgate-attempts"] == "2"
    assert [r.attempt for r in attempts_of(fake, rid)] == [1, 2]
    assert metric(gate, 'chatgate_upstream_retries_total{reason="timeout"}') == 1
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["attempts"]) == ("ok", 2)


class ResettingServer:
    """Accepts each connection and resets it at once (SO_LINGER 0): a reset before any header."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_connection_reset_before_the_headers_is_retried(start_gate: Callable[..., RunningChatgate]) -> None:
    server = ResettingServer()
    try:
        gate = start_gate(upstream_url=server.url, upstream=RETRYING)
        resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(), headers=JSON_HEADERS,
                           timeout=20)
        assert resp.status_code == 502
        assert resp.headers["x-should-retry"] == "false"
        assert "chatgate made 3 attempts" in resp.json()["error"]["message"]
        assert metric(gate, 'chatgate_upstream_retries_total{reason="connect"}') == 2
    finally:
        server.close()
    assert server.accepted >= 3  # (a pooled connection the client found dead may be opened again)


# -------------------------------------------------------------------------------------------- waits


def test_retry_after_as_an_http_date_is_waited(sdk: openai.OpenAI, fake: RunningFake) -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)  # whole seconds: 1 to 2 s from now
    rid, headers = faults("http_503", 1, **{"x-fake-retry-after": when})
    t0 = time.monotonic()
    raw = sdk.chat.completions.with_raw_response.create(model="deepseek-flash", messages=MESSAGES,
                                                          extra_headers=headers)
    assert raw.headers["x-chatgate-attempts"] == "2"
    first, second = attempts_of(fake, rid)
    assert (first.status, second.status) == (503, 200)
    assert second.received_at - first.received_at >= 0.9
    assert time.monotonic() - t0 < 5


def test_a_retry_after_past_the_budget_is_not_waited(sdk: openai.OpenAI, fake: RunningFake) -> None:
    rid, headers = faults("http_503", 5, **{"x-fake-retry-after": "60"})  # retry_max_wait_s is 10
    t0 = time.monotonic()
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    assert time.monotonic() - t0 < 3
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "chatgate made 1 attempts" in caught.value.message
    assert len(attempts_of(fake, rid)) == 1


def test_anthropic_sdk_429_retry_after_is_waited(claude: anthropic.Anthropic, fake: RunningFake) -> None:
    rid, headers = faults("http_429", 1, **{"x-fake-retry-after": "1"})
    raw = claude.messages.with_raw_response.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES,
                                                   extra_headers=headers)
    assert raw.parse().stop_reason is not None and raw.headers["x-chatgate-attempts"] == "2"
    first, second = attempts_of(fake, rid)
    assert (first.status, second.status) == (429, 200)
    assert second.received_at - first.received_at >= 0.95


# ----------------------------------------------------------------------------------------- hang-ups


@pytest.mark.slow  # waits 3.5 s of real time for an attempt that must not come
def test_a_stream_whose_client_hangs_up_during_a_back_off_gets_no_further_attempt(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    rid, headers = faults("http_503", 99, **{"x-fake-retry-after": "3"})
    with pytest.raises(httpx2.ReadTimeout), httpx2.stream(
            "POST", gate.url + "/v1/chat/completions", json=chat_body(stream=True), timeout=0.5,
            headers={**JSON_HEADERS, **headers}) as resp:
        resp.read()
    (row,) = usage_rows(tmp_path, 1, timeout=3)
    assert (row["outcome"], row["latency_ms"] < 2500) == ("client_disconnected", True)
    time.sleep(3.5)  # past the wait: no further attempt was made
    assert len(attempts_of(fake, rid)) == 1


@pytest.mark.slow  # waits 3.5 s of real time for an attempt that must not come
def test_an_anthropic_client_hanging_up_during_a_back_off(gate: RunningChatgate, fake: RunningFake,
                                                          tmp_path: Path) -> None:
    rid, headers = faults("http_503", 99, **{"x-fake-retry-after": "3"})
    with (anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key="sk-retry-rules", max_retries=0,
                              timeout=0.5) as c, pytest.raises(anthropic.APITimeoutError)):
        c.messages.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES, extra_headers=headers)
    (row,) = usage_rows(tmp_path, 1, timeout=3)
    assert row["outcome"] == "client_disconnected"
    time.sleep(3.5)
    assert len(attempts_of(fake, rid)) == 1


# ------------------------------------------------------------------------------ streams, anthropic SDK


def claude_text(stream: Any, out: list[str] | None = None) -> list[str]:
    """Each text or thinking delta of an anthropic SDK stream, in order (into `out`, kept if it raises)."""
    out = [] if out is None else out
    for event in stream:
        if event.type == "content_block_delta":
            delta = event.delta
            out.append(getattr(delta, "text", None) or getattr(delta, "thinking", None) or "")
    return out


def test_anthropic_stream_failing_twice_before_its_first_byte(claude: anthropic.Anthropic, fake: RunningFake,
                                                              tmp_path: Path) -> None:
    undisturbed = claude_text(claude.messages.create(model="deepseek-flash", max_tokens=100,
                                                     messages=MESSAGES, stream=True))
    rid, headers = faults("http_503", 2)
    with claude.messages.with_streaming_response.create(model="deepseek-flash", max_tokens=100, stream=True,
                                                        messages=MESSAGES, extra_headers=headers) as resp:
        assert resp.headers["x-chatgate-attempts"] == "3"
        text = claude_text(resp.parse())
    assert text == undisturbed
    assert [r.status for r in attempts_of(fake, rid)] == [503, 503, 200]
    rows = usage_rows(tmp_path, 2)
    assert [(r["outcome"], r["attempts"]) for r in rows] == [("ok", 1), ("ok", 3)]
    assert rows[0]["completion_tokens"] == rows[1]["completion_tokens"] > 0


def test_anthropic_stream_dropped_after_two_data_events_is_not_retried(
        claude: anthropic.Anthropic, fake: RunningFake, tmp_path: Path) -> None:
    undisturbed = claude_text(claude.messages.create(model="deepseek-flash", max_tokens=100,
                                                     messages=MESSAGES, stream=True))
    fake.state.configure(fault_after_chunks=4)  # message_start, a block's start, two deltas
    rid, headers = faults("reset_mid_stream", 1)
    got: list[str] = []
    with pytest.raises(anthropic.APIError):
        claude_text(claude.messages.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES,
                                           stream=True, extra_headers=headers), got)
    assert len(attempts_of(fake, rid)) == 1
    assert got and got == undisturbed[:len(got)]  # what arrived, once, in order
    rows = usage_rows(tmp_path, 2)
    assert (rows[-1]["outcome"], rows[-1]["attempts"]) == ("upstream_failed", 1)


def test_a_stream_after_keepalives_has_one_record_with_its_attempts(sdk: openai.OpenAI, fake: RunningFake,
                                                                    tmp_path: Path) -> None:
    """The head went out before the retry: the attempts are in the record, not on the head."""
    fake.state.configure(keepalive_count=2, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 1)
    with sdk.chat.completions.with_streaming_response.create(model="deepseek-flash", messages=MESSAGES,
                                                             stream=True, extra_headers=headers) as resp:
        assert "x-chatgate-attempts" not in resp.headers
        text = stream_text(resp.parse())
    assert text.startswith("Answer 1")
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["attempts"]) == ("ok", 2)
    assert row["completion_tokens"] == attempts_of(fake, rid)[-1].usage["completion_tokens"]


def test_a_drop_after_data_events_relays_each_event_once(sdk: openai.OpenAI, fake: RunningFake) -> None:
    """The retries stay off once data has gone out, whatever the budget left: the text is never doubled."""
    undisturbed = pieces(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True))
    fake.state.configure(fault_after_chunks=3)
    rid, headers = faults("reset_mid_stream", 99)
    got: list[str] = []
    with pytest.raises(openai.APIError):
        pieces(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                           extra_headers=headers), got)
    assert got == undisturbed[:3] and len(attempts_of(fake, rid)) == 1


# ------------------------------------------------------------------------------ nothing counts twice


def test_a_limits_reservation_is_held_once_across_the_attempts(start_gate: Callable[..., RunningChatgate],
                                                               fake: RunningFake, tmp_path: Path) -> None:
    """max_concurrent = 1: the retried request is not refused by its own reservation, another request of the
    key is refused while it waits, and each has one record."""
    from tests.quotas.support import client, key_subject, set_limits

    gate = start_gate(upstream=RETRYING, limits={"cache_seconds": 0})
    secret = "sk-retry-concurrency-0001"
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(secret), max_concurrent=1)
    rid, headers = faults("http_503", 1, **{"x-fake-retry-after": "1"})
    done: list[Any] = []
    first = threading.Thread(target=lambda: done.append(client(gate.url, secret).chat.completions
                             .with_raw_response.create(model="deepseek-flash", messages=MESSAGES,
                                                       extra_headers=headers)))
    first.start()
    deadline = time.monotonic() + 5
    while not attempts_of(fake, rid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(openai.RateLimitError, match="in flight"):  # during the first one's wait
        client(gate.url, secret).chat.completions.create(model="deepseek-flash", messages=MESSAGES)
    first.join(10)
    (raw,) = done
    assert raw.http_response.status_code == 200 and raw.headers["x-chatgate-attempts"] == "2"
    rows = usage_rows(tmp_path, 2)
    assert sorted((r["outcome"], r["attempts"]) for r in rows) == [("limited", 1), ("ok", 2)]


@pytest.mark.slow  # waits 3.5 s of real time for an attempt that must not come
def test_a_client_hanging_up_while_a_kept_alive_stream_waits_to_be_retried(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    """The stream's head and keep-alives went out, DeepSeek dropped it, chatgate waits its back-off (3 s here:
    the jitter fixed at its ceiling) and the client goes away meanwhile: no second attempt."""
    gate = start_gate(upstream={**RETRYING, "retry_base_ms": 3000})
    gate.state.gateway.retrier.rng = lambda: 1.0
    fake.state.configure(keepalive_count=2, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 99)
    received = b""
    with pytest.raises(httpx2.ReadTimeout), httpx2.stream(
            "POST", gate.url + "/v1/chat/completions", json=chat_body(stream=True), timeout=0.7,
            headers={**JSON_HEADERS, **headers}) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_raw():
            received += chunk
    assert received.startswith(b":") and b"data:" not in received  # only the keep-alives
    (row,) = usage_rows(tmp_path, 1, timeout=3)
    assert row["outcome"] == "client_disconnected"
    time.sleep(3.5)  # past the back-off: nothing more was sent upstream for it
    assert len(attempts_of(fake, rid)) == 1
