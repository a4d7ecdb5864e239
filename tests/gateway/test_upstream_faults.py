"""DeepSeek misbehaving: every fault gets a defined answer quickly (no hang) and exactly one usage record
with the right outcome. DeepSeek's own errors pass through unchanged; a broken transport is a 502/504."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.demo.deepseek import ERROR_FAULTS, PLAIN_422, error_bytes
from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body, usage_rows
from tests.harness import RunningChatgate, unreachable_url


@pytest.fixture(params=["uvloop", "asyncio"])
def event_loop_name(request: pytest.FixtureRequest) -> str:
    """Relay, streaming and disconnect behaviour on both event loops (production runs uvloop)."""
    return str(request.param)

MESSAGES: Any = [{"role": "user", "content": "Draft a polite reply to my landlord"}]
FAST_TIMEOUTS = {"read_timeout": 0.5, "connect_timeout": 2.0}


@pytest.fixture
def sdk(gate: RunningChatgate) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-fault-tests", max_retries=0, timeout=10) as c:
        yield c


@pytest.fixture
def impatient(start_gate: Callable[..., RunningChatgate]) -> Iterator[openai.OpenAI]:
    """chatgate with a 0.5 s upstream read timeout."""
    gate = start_gate(upstream=FAST_TIMEOUTS)
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-fault-tests", max_retries=0, timeout=10) as c:
        yield c


def fault(name: str) -> dict[str, str]:
    return {"x-fake-fault": name}


def one_record(tmp_path: Path, outcome: str, upstream_status: int | None) -> dict[str, Any]:
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["upstream_status"]) == (outcome, upstream_status)
    return row


# ------------------------------------------------------------------------------ DeepSeek's own errors


@pytest.mark.parametrize(("name", "exc_type"), [
    ("http_500", openai.InternalServerError),
    ("http_503", openai.InternalServerError),
    ("http_429", openai.RateLimitError),
    ("http_402", openai.APIStatusError),
    ("http_401", openai.AuthenticationError),
    ("http_400", openai.BadRequestError),
])  # fmt: skip
def test_deepseek_error_is_passed_through(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path, name: str,
                                          exc_type: type[openai.APIStatusError]) -> None:
    status = 401 if name == "http_401" else ERROR_FAULTS[name][0]
    with pytest.raises(exc_type) as caught:
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, extra_headers=fault(name))
    assert caught.value.status_code == status
    if name != "http_401":
        assert caught.value.message.endswith(ERROR_FAULTS[name][1])
    assert len(fake.state.requests) == 1
    one_record(tmp_path, "upstream_error", status)


@pytest.mark.parametrize("name", ["http_402", "http_429", "http_500"])
def test_error_body_and_status_are_unchanged(gate: RunningChatgate, fake: RunningFake, tmp_path: Path,
                                             name: str) -> None:
    status, message, error_type = ERROR_FAULTS[name]
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body()),
                           headers={**JSON_HEADERS, **fault(name), "x-request-id": "rid-err"}, timeout=10)
    assert response.status_code == status
    assert response.content == error_bytes(message, error_type)
    assert response.headers["x-request-id"] == "rid-err"
    one_record(tmp_path, "upstream_error", status)


def test_plain_text_422_is_passed_through(gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body()),
                           headers={**JSON_HEADERS, **fault("http_422")}, timeout=10)
    assert (response.status_code, response.content) == (422, PLAIN_422)
    one_record(tmp_path, "upstream_error", 422)


def test_streaming_request_error_before_stream_is_passed_through(sdk: openai.OpenAI, fake: RunningFake,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(openai.RateLimitError):
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                    extra_headers=fault("http_429"))
    row = one_record(tmp_path, "upstream_error", 429)
    assert row["stream"] == 1


# ------------------------------------------------------------------------------ unreachable upstream


@pytest.mark.parametrize("stream", [False, True])
def test_connection_refused_is_502(start_gate: Callable[..., RunningChatgate], tmp_path: Path,
                                   stream: bool) -> None:
    gate = start_gate(upstream_url=unreachable_url())
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body(stream=stream)),
                           headers=JSON_HEADERS, timeout=10)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unreachable")
    assert "sk-test" not in response.text and "/chat/completions" not in response.text
    one_record(tmp_path, "upstream_failed", None)


def test_connection_refused_through_the_sdk(start_gate: Callable[..., RunningChatgate]) -> None:
    gate = start_gate(upstream_url=unreachable_url())
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-x", max_retries=0, timeout=10) as client, \
            pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="deepseek-flash", messages=MESSAGES)
    assert caught.value.status_code == 502


def test_headers_that_never_come_are_504(impatient: openai.OpenAI, fake: RunningFake, tmp_path: Path) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        impatient.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                          extra_headers=fault("no_headers"))
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert fake.state.wait_idle(3.0)  # chatgate gave up and closed the upstream request
    assert fake.state.requests[0].outcome == "client_disconnected"
    one_record(tmp_path, "upstream_failed", None)


def test_non_json_200_is_502(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                    extra_headers=fault("non_json_200"))
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_bad_response"
    assert "<html>" not in caught.value.message
    one_record(tmp_path, "upstream_failed", None)


def test_body_cut_mid_response_is_502(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                    extra_headers=fault("reset_mid_stream"))
    assert caught.value.status_code == 502
    one_record(tmp_path, "upstream_failed", None)


def test_body_stalled_mid_response_is_504(impatient: openai.OpenAI, fake: RunningFake,
                                          tmp_path: Path) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        impatient.chat.completions.create(model="deepseek-flash", messages=MESSAGES,
                                          extra_headers=fault("stall_mid_stream"))
    assert caught.value.status_code == 504
    one_record(tmp_path, "upstream_failed", None)


# ------------------------------------------------------------------------------ streams that break


def consume(stream: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_reset_mid_stream_raises_in_the_sdk(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path) -> None:
    """Not a silently truncated answer: an `error` event, then the stream closes."""
    stream = sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                         extra_headers=fault("reset_mid_stream"))
    with pytest.raises(openai.APIError) as caught:
        consume(stream)
    assert caught.value.code == "upstream_stream_broken"
    assert "incomplete" in caught.value.message
    assert fake.state.requests[0].outcome == "reset"
    row = one_record(tmp_path, "upstream_failed", 200)
    assert row["tokens_exact"] == 0


def test_reset_mid_stream_wire_format(gate: RunningChatgate, fake: RunningFake) -> None:
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body(stream=True)),
                           headers={**JSON_HEADERS, **fault("reset_mid_stream")}, timeout=10)
    assert response.status_code == 200  # the headers were already sent when the stream broke
    blocks = [b for b in response.content.split(b"\n\n") if b]
    last = orjson.loads(blocks[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_stream_broken"
    assert b"[DONE]" not in response.content


class CutMidLine(httpx2.AsyncByteStream):
    """One whole chunk, then half of the next, then the connection resets."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"deepseek-flash",'
               b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Dear landlord,"},'
               b'"finish_reason":null}]}\n\n')
        yield b'data: {"id":"c1","object":"chat.completion.chu'
        raise httpx2.ReadError("connection reset by peer")


def test_reset_in_the_middle_of_an_event_still_raises_an_api_error(
        start_gate: Callable[..., RunningChatgate], tmp_path: Path) -> None:
    """The half event is not relayed; the error event stands alone, so the SDK raises APIError (not a
    JSON decode error)."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=CutMidLine())

    gate = start_gate(upstream_url="http://deepseek.invalid", transport=httpx2.MockTransport(handler))
    with openai.OpenAI(base_url=gate.url, api_key="sk-x", max_retries=0, timeout=10) as client:
        received: list[str] = []
        with pytest.raises(openai.APIError) as caught:
            stream = client.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True)
            received.extend(chunk.choices[0].delta.content or "" for chunk in stream)
    assert received == ["Dear landlord,"]
    assert caught.value.code == "upstream_stream_broken"
    row = one_record(tmp_path, "upstream_failed", 200)
    assert row["completion_tokens"] > 0


@pytest.mark.parametrize("name", ["reset_after_end", "stall_after_end"])
def test_a_stream_that_has_ended_is_complete_whatever_the_connection_does_next(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, name: str) -> None:
    """After `data: [DONE]` the answer is whole: a reset is not an error event, and a connection left open
    does not hold the client until the upstream timeout (the openai SDK stops at [DONE] by itself; clients
    of the other families, and raw HTTP, read to the end)."""
    fake.state.hang_seconds = 30
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body(stream=True)),
                           headers={**JSON_HEADERS, **fault(name)}, timeout=5)
    assert response.status_code == 200
    assert response.content.endswith(b"data: [DONE]\n\n")
    assert b"upstream_stream_broken" not in response.content
    row = one_record(tmp_path, "ok", 200)
    assert row["tokens_exact"] == 1
    assert fake.state.wait_idle(5.0)  # chatgate closed its upstream request


class EventLineThenCut(httpx2.AsyncByteStream):
    """A Responses stream: one whole event, then the next one's `event:` line and half its data line."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield (b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
               b'"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}\n\n')
        yield b'event: response.output_text.delta\ndata: {"type":"response.output_text.de'
        raise httpx2.ReadError("connection reset by peer")


def test_a_stream_cut_after_an_event_line_raises_an_api_error(
        start_gate: Callable[..., RunningChatgate], tmp_path: Path) -> None:
    """The held `event:` line takes chatgate's error as its data: the SDK sees an error, not an event
    without data (a JSON decode error)."""
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=EventLineThenCut())

    gate = start_gate(upstream_url="http://deepseek.invalid", transport=httpx2.MockTransport(handler))
    with openai.OpenAI(base_url=gate.url, api_key="sk-x", max_retries=0, timeout=10) as client:
        seen: list[str] = []
        with pytest.raises(openai.APIError) as caught:
            for event in client.responses.create(model="deepseek-flash", input="hi", stream=True):
                seen.append(event.type)
    assert seen == ["response.created"]
    assert "incomplete" in caught.value.message
    one_record(tmp_path, "upstream_failed", 200)


def test_stall_mid_stream_past_read_timeout_raises(impatient: openai.OpenAI, fake: RunningFake,
                                                   tmp_path: Path) -> None:
    stream = impatient.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                               extra_headers=fault("stall_mid_stream"))
    with pytest.raises(openai.APIError):
        consume(stream)
    assert fake.state.wait_idle(3.0)  # the stalled upstream request was closed
    assert fake.state.requests[0].outcome == "client_disconnected"
    one_record(tmp_path, "upstream_failed", 200)


def test_stall_mid_stream_past_the_total_timeout_ends_the_stream(start_gate: Callable[..., RunningChatgate],
                                                                 fake: RunningFake, tmp_path: Path) -> None:
    """The deadline of the whole request (upstream.total_timeout) ends a stream that stalls between events
    although each read is within the read timeout: the relay arms it before its first wait on DeepSeek."""
    gate = start_gate(upstream={"total_timeout": 1.0, "read_timeout": 30.0, "connect_timeout": 2.0})
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-fault-tests", max_retries=0, timeout=10) as c:
        stream = c.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                           extra_headers=fault("stall_mid_stream"))
        with pytest.raises(openai.APIError) as caught:
            consume(stream)
    assert "DeepSeek sent nothing for longer than the upstream timeout" in caught.value.message
    assert fake.state.wait_idle(3.0)  # the stalled upstream request was closed
    one_record(tmp_path, "upstream_failed", 200)


def test_error_event_from_deepseek_mid_stream_raises(sdk: openai.OpenAI, fake: RunningFake,
                                                     tmp_path: Path) -> None:
    stream = sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                         extra_headers=fault("error_mid_stream"))
    with pytest.raises(openai.APIError) as caught:
        consume(stream)
    assert caught.value.message == "Internal Server Error"
    row = one_record(tmp_path, "upstream_error", 200)  # DeepSeek's own error, relayed as it sent it
    assert row["completion_tokens"] > 0


def test_gateway_serves_normally_after_faults(sdk: openai.OpenAI, fake: RunningFake) -> None:
    for name in ("reset_mid_stream", "http_500", "non_json_200"):
        with pytest.raises(openai.APIError):
            consume(sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                                extra_headers=fault(name)))
    reply = sdk.chat.completions.create(model="deepseek-flash", messages=MESSAGES)
    assert reply.choices[0].message.content


def test_streaming_request_answered_without_event_stream_is_502(gate: RunningChatgate, fake: RunningFake,
                                                                 tmp_path: Path) -> None:
    """A 200 that is not text/event-stream is not relayed as an empty, "successful" stream."""
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body(stream=True)),
                           headers={**JSON_HEADERS, **fault("non_json_200")}, timeout=10)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_bad_response"
    one_record(tmp_path, "upstream_failed", None)
