"""Retries before the first data event (docs/retries.md), end to end: the openai and anthropic SDKs (their own
retries off) -> chatgate on a loopback port -> the fake DeepSeek, whose faults apply to the first N attempts
of a request (the attempts of one request share its x-request-id)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body, usage_rows
from tests.harness import RunningChatgate, unreachable_url

MESSAGES: Any = [{"role": "user", "content": "Plan a three-day trip to Lisbon"}]
RETRYING = {"retries": 2, "retry_base_ms": 50, "retry_max_wait_s": 10}


@pytest.fixture
def gate(start_gate: Callable[..., RunningChatgate]) -> RunningChatgate:
    return start_gate(upstream=RETRYING, server={"access_log": True})


@pytest.fixture
def sdk(gate: RunningChatgate) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-retry-tests", max_retries=0, timeout=20) as c:
        yield c


def faults(name: str, attempts: int, **extra: str) -> tuple[str, dict[str, str]]:
    """A request id and the headers that inject `name` into the first `attempts` attempts of it."""
    rid = "req-" + uuid.uuid4().hex
    return rid, {"x-request-id": rid, "x-fake-fault": name, "x-fake-fault-attempts": str(attempts), **extra}


def attempts_of(fake: RunningFake, rid: str) -> list[Any]:
    return [r for r in fake.state.requests if r.request_id == rid]


def pieces(stream: Any, out: list[str] | None = None) -> list[str]:
    """Each event's text (reasoning or content), as the SDK yields them, into `out` (kept if it raises)."""
    out = [] if out is None else out
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            out.append((getattr(delta, "reasoning_content", None) or "") + (delta.content or ""))
    return out


def stream_text(stream: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# ------------------------------------------------------------------------------------- non-streaming


def test_503_twice_then_200(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path) -> None:
    rid, headers = faults("http_503", 2)
    raw = sdk.chat.completions.with_raw_response.create(model="deepseek-flash", messages=MESSAGES,
                                                          extra_headers=headers)
    answer = raw.parse()
    assert answer.choices[0].message.content.startswith("Answer 1")
    assert raw.headers["x-chatgate-attempts"] == "3"
    assert [r.status for r in attempts_of(fake, rid)] == [503, 503, 200]
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["upstream_status"]) == ("ok", 200)


def test_no_header_when_the_first_attempt_answers(sdk: openai.OpenAI, fake: RunningFake) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="deepseek-flash", messages=MESSAGES)
    assert "x-chatgate-attempts" not in raw.headers
    assert len(fake.state.requests) == 1


def test_429_retry_after_is_waited(sdk: openai.OpenAI, fake: RunningFake) -> None:
    rid, headers = faults("http_429", 1, **{"x-fake-retry-after": "1"})
    t0 = time.monotonic()
    sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    assert time.monotonic() - t0 >= 0.95
    first, second = attempts_of(fake, rid)
    assert (first.status, second.status) == (429, 200)
    assert second.received_at - first.received_at >= 0.95


@pytest.mark.parametrize(("name", "status"), [("http_400", 400), ("http_402", 402), ("http_422", 422),
                                              ("http_401", 401)])
def test_client_and_account_errors_are_not_retried(gate: RunningChatgate, fake: RunningFake, name: str,
                                                   status: int) -> None:
    rid, headers = faults(name, 5)
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(),
                       headers={**JSON_HEADERS, **headers})
    assert resp.status_code == status
    assert len(attempts_of(fake, rid)) == 1
    assert "x-should-retry" not in resp.headers and "x-chatgate-attempts" not in resp.headers


def test_spent_retries_say_so_and_stop_the_sdks_retries(gate: RunningChatgate, fake: RunningFake,
                                                        tmp_path: Path) -> None:
    rid, headers = faults("http_503", 99)
    # the SDK's own retries on: x-should-retry: false keeps it from multiplying chatgate's attempts
    with (openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-retry-tests", max_retries=2) as client,
          pytest.raises(openai.InternalServerError) as caught):
        client.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert caught.value.response.headers["x-chatgate-attempts"] == "3"
    assert "chatgate made 3 attempts over" in caught.value.message
    assert "Server Overloaded" in caught.value.message
    assert len(attempts_of(fake, rid)) == 3
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["upstream_status"]) == ("upstream_error", 503)


def test_refused_connection_is_retried_then_502(start_gate: Callable[..., RunningChatgate]) -> None:
    gate = start_gate(upstream_url=unreachable_url(), upstream=RETRYING)
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(), headers=JSON_HEADERS)
    assert resp.status_code == 502
    assert resp.headers["x-should-retry"] == "false"
    assert "chatgate made 3 attempts" in resp.json()["error"]["message"]
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_upstream_retries_total{reason="connect"} 2.0' in metrics


def test_keepalive_lines_then_a_drop_give_one_json_document(sdk: openai.OpenAI, fake: RunningFake) -> None:
    undisturbed = sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES)
    fake.state.configure(nonstream_keepalive_lines=3, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 1)
    raw = sdk.chat.completions.with_raw_response.create(model="deepseek-flash", messages=MESSAGES,
                                                          extra_headers=headers)
    answer = raw.parse()  # one valid JSON document
    assert answer.choices[0].message.content == undisturbed.choices[0].message.content
    assert [r.outcome for r in attempts_of(fake, rid)] == ["reset", "completed"]


def test_a_body_cut_after_json_bytes_is_not_retried(sdk: openai.OpenAI, fake: RunningFake) -> None:
    rid, headers = faults("reset_mid_stream", 1)  # half the JSON body, then the connection drops
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    assert caught.value.status_code == 502
    assert len(attempts_of(fake, rid)) == 1


@pytest.mark.slow  # waits 3.5 s of real time for an attempt that must not come
def test_client_hanging_up_during_a_back_off_stops_the_attempts(gate: RunningChatgate, fake: RunningFake,
                                                                tmp_path: Path) -> None:
    rid, headers = faults("http_503", 99, **{"x-fake-retry-after": "3"})
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(gate.url + "/v1/chat/completions", json=chat_body(), headers={**JSON_HEADERS, **headers},
                    timeout=0.5)
    (row,) = usage_rows(tmp_path, 1, timeout=3)
    assert (row["outcome"], row["latency_ms"] < 2500) == ("client_disconnected", True)
    time.sleep(3.5)  # past the wait: no further attempt was made
    assert len(attempts_of(fake, rid)) == 1


def test_the_access_log_says_the_attempts(capfd: pytest.CaptureFixture[str], sdk: openai.OpenAI,
                                          fake: RunningFake) -> None:
    rid, headers = faults("http_500", 1)
    sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=headers)
    time.sleep(0.2)
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    (line,) = [x for x in lines if x.get("request_id") == rid]
    assert line["attempts"] == 2


# ------------------------------------------------------------------------------------ other families


def test_anthropic_route_503_twice_then_200(gate: RunningChatgate, fake: RunningFake) -> None:
    rid, headers = faults("http_503", 2)
    with anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key="sk-retry-tests", max_retries=0) as c:
        raw = c.messages.with_raw_response.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES,
                                                  extra_headers=headers)
    assert raw.parse().content[0].type in ("text", "thinking")
    assert raw.headers["x-chatgate-attempts"] == "3"
    assert [r.status for r in attempts_of(fake, rid)] == [503, 503, 200]


def test_anthropic_route_spent_retries_keep_anthropics_shape(gate: RunningChatgate,
                                                             fake: RunningFake) -> None:
    rid, headers = faults("http_500", 99)
    with (anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key="sk-retry-tests", max_retries=2) as c,
          pytest.raises(anthropic.InternalServerError) as caught):
        c.messages.create(model="deepseek-flash", max_tokens=100, messages=MESSAGES, extra_headers=headers)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "chatgate made 3 attempts" in str(caught.value)
    assert len(attempts_of(fake, rid)) == 3


@pytest.mark.parametrize(("path", "body"), [
    ("/beta/completions", {"model": "deepseek-flash", "prompt": "def add(a, b):", "max_tokens": 16}),
    ("/v1/responses", {"model": "deepseek-flash", "input": "Say hello"}),
])
def test_fim_and_responses_are_retried(gate: RunningChatgate, fake: RunningFake, path: str,
                                       body: dict[str, Any]) -> None:
    rid, headers = faults("http_503", 1)
    resp = httpx2.post(gate.url + path, json=body, headers={**JSON_HEADERS, **headers}, timeout=20)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-attempts"] == "2"
    assert [r.status for r in attempts_of(fake, rid)] == [503, 200]


# ------------------------------------------------------------------------------------------ streams


def test_a_stream_failing_twice_before_its_first_byte(sdk: openai.OpenAI, fake: RunningFake,
                                                      tmp_path: Path) -> None:
    undisturbed = stream_text(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                                          stream=True))
    rid, headers = faults("http_503", 2)
    with sdk.chat.completions.with_streaming_response.create(model="deepseek-flash", messages=MESSAGES,
                                                             stream=True, extra_headers=headers) as resp:
        assert resp.headers["x-chatgate-attempts"] == "3"
        text = stream_text(resp.parse())
    assert text == undisturbed
    assert [r.status for r in attempts_of(fake, rid)] == [503, 503, 200]
    rows = usage_rows(tmp_path, 2)
    assert [r["outcome"] for r in rows] == ["ok", "ok"]


def test_keepalives_then_a_drop_give_one_complete_stream(gate: RunningChatgate, sdk: openai.OpenAI,
                                                         fake: RunningFake, tmp_path: Path) -> None:
    undisturbed = stream_text(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                                          stream=True))
    fake.state.configure(keepalive_count=3, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 1)
    with httpx2.stream("POST", gate.url + "/v1/chat/completions", headers={**JSON_HEADERS, **headers},
                       json=chat_body(MESSAGES[0]["content"], stream=True), timeout=20) as resp:
        raw = b"".join(resp.iter_bytes())
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    data = [e for e in events if e.startswith(b"data:")]
    assert data[-1] == b"data: [DONE]" and raw.count(b"[DONE]") == 1
    assert all(e.startswith((b"data:", b":")) for e in events)  # well formed: no error event, no half event
    chunks = [json.loads(e[5:]) for e in data[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == undisturbed
    assert len({c["id"] for c in chunks}) == 1  # one answer's events only
    assert [r.outcome for r in attempts_of(fake, rid)] == ["reset", "completed"]
    rows = usage_rows(tmp_path, 2)
    assert rows[-1]["outcome"] == "ok"


def test_keepalives_then_a_drop_through_the_sdk(sdk: openai.OpenAI, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=2, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 2)
    text = stream_text(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                                   extra_headers=headers))
    assert text.startswith("Answer 1")
    assert len(attempts_of(fake, rid)) == 3


def test_a_drop_after_two_data_events_is_not_retried(sdk: openai.OpenAI, fake: RunningFake,
                                                     tmp_path: Path) -> None:
    undisturbed = pieces(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True))
    fake.state.configure(fault_after_chunks=2)
    rid, headers = faults("reset_mid_stream", 1)
    got: list[str] = []
    with pytest.raises(openai.APIError, match="incomplete"):
        pieces(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                           extra_headers=headers), got)
    assert len(attempts_of(fake, rid)) == 1
    assert got == undisturbed[:2]  # the two events that arrived, once each
    assert usage_rows(tmp_path, 2)[-1]["outcome"] == "upstream_failed"


def test_anthropic_stream_keepalives_then_a_drop(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=2, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 1)
    with (anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key="sk-retry-tests", max_retries=0) as c,
          c.messages.stream(model="deepseek-flash", max_tokens=100, messages=MESSAGES,
                            extra_headers=headers) as stream):
        message = stream.get_final_message()
    assert message.stop_reason is not None
    assert len(attempts_of(fake, rid)) == 2


def test_keepalives_then_drops_past_the_retries_end_in_one_error_event(sdk: openai.OpenAI,
                                                                      fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=1, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 99)
    with pytest.raises(openai.APIError, match="chatgate made 3 attempts"):
        stream_text(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                                extra_headers=headers))
    assert len(attempts_of(fake, rid)) == 3


def test_responses_stream_keepalives_then_a_drop(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=2, fault_after_chunks=0)
    rid, headers = faults("reset_mid_stream", 1)
    with httpx2.stream("POST", gate.url + "/v1/responses", headers={**JSON_HEADERS, **headers}, timeout=20,
                       json={"model": "deepseek-flash", "input": "Say hello", "stream": True}) as resp:
        raw = b"".join(resp.iter_bytes())
    events = [e for e in raw.split(b"\n\n") if e.strip() and not e.startswith(b":")]
    names = [e.split(b"\n", 1)[0] for e in events]
    assert names[0] == b"event: response.created" and names[-1] == b"event: response.completed", names
    assert names.count(b"event: response.created") == 1 and b"event: error" not in names
    assert len(attempts_of(fake, rid)) == 2
