"""Streaming through chatgate: chunk-by-chunk relay, keep-alives, [DONE], usage metering and stripping,
and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.demo.deepseek import make_plan
from chatgate.gateway.upstream import AiohttpAnswer, TransportAnswer, Upstream, read_whole
from chatgate.settings import UpstreamSettings
from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body, usage_rows
from tests.harness import RunningChatgate


@pytest.fixture(params=["uvloop", "asyncio"])
def event_loop_name(request: pytest.FixtureRequest) -> str:
    """Relay, streaming and disconnect behaviour on both event loops (production runs uvloop)."""
    return str(request.param)


@contextmanager
def open_stream(gate: RunningChatgate, body: dict[str, Any], **headers: str) -> Iterator[httpx2.Response]:
    with httpx2.Client(timeout=httpx2.Timeout(10)) as client, client.stream(
            "POST", gate.url + "/v1/chat/completions", content=orjson.dumps(body),
            headers={**JSON_HEADERS, **headers}) as response:
        yield response


def data_events(raw: bytes) -> list[Any]:
    """The JSON payloads of `data:` lines ([DONE] excluded)."""
    return [orjson.loads(line[6:]) for line in raw.split(b"\n")
            if line.startswith(b"data: {")]


def read_all(gate: RunningChatgate, body: dict[str, Any]) -> bytes:
    with open_stream(gate, body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return response.read()


CHUNK_DELAY = 0.05  # the fake sleeps this long before each event


def assert_spread_over_time(arrivals: list[float]) -> None:
    """Events the fake sent CHUNK_DELAY apart reached the client apart too, not in bursts. The bounds leave
    room for a loaded machine (a late event shortens the next gap), yet fail for a relay that buffers all
    events, or pairs of them."""
    gaps = [later - earlier for earlier, later in pairwise(arrivals)]
    assert len(gaps) >= 10, f"too few events to judge: {len(arrivals)}"
    wide = [gap for gap in gaps if gap >= 0.7 * CHUNK_DELAY]
    assert len(wide) >= 0.6 * len(gaps), f"gaps (ms): {[round(gap * 1000) for gap in gaps]}"
    assert arrivals[-1] - arrivals[0] >= 0.8 * CHUNK_DELAY * len(gaps)


def test_chunks_are_relayed_as_they_arrive(gate: RunningChatgate, fake: RunningFake) -> None:
    """No buffering: each event reaches the client when DeepSeek sends it, the first one while DeepSeek is
    still generating."""
    fake.state.configure(chunk_delay=CHUNK_DELAY)
    raw = b""
    arrivals: list[float] = []  # when each complete `data: {` event was read
    sent_at_first_data: int | None = None
    with open_stream(gate, chat_body("Tell me a short story", stream=True)) as response:
        for piece in response.iter_raw():
            now = time.monotonic()
            raw += piece
            events = sum(block.startswith(b"data: {") for block in raw.split(b"\n\n")[:-1])
            arrivals += [now] * (events - len(arrivals))
            if events and sent_at_first_data is None:
                rec = fake.state.requests[0]
                assert rec.outcome == "pending"  # the fake had not finished when the client saw data
                sent_at_first_data = len(rec.sent)
    rec = fake.state.requests[0]
    assert raw.endswith(b"data: [DONE]\n\n") and rec.outcome == "completed"
    assert sent_at_first_data is not None and sent_at_first_data < len(rec.sent) // 4
    assert len(arrivals) == len(data_events(raw))
    assert_spread_over_time(arrivals)


def test_sdk_sees_chunks_spread_over_time(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(chunk_delay=CHUNK_DELAY)
    arrivals: list[float] = []
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-stream", max_retries=0) as client:
        for _ in client.chat.completions.create(model="deepseek-flash", stream=True,
                                                messages=[{"role": "user", "content": "Count to five"}]):
            arrivals.append(time.monotonic())
    assert len(arrivals) == len(data_events(bytes(fake.state.requests[0].sent)))
    assert_spread_over_time(arrivals)


def test_keepalive_comments_and_done_are_relayed(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=3)
    raw = read_all(gate, chat_body(stream=True))
    assert raw.startswith(b": keep-alive\n\n: keep-alive\n\n: keep-alive\n\ndata: {")
    assert raw.endswith(b"data: [DONE]\n\n")
    assert raw.count(b"data: [DONE]") == 1


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}, {"thinking": {"type": "disabled"}}],
                         ids=["text", "tool_call", "no_thinking"])
def test_relayed_stream_is_byte_identical_to_upstream(start_gate: Callable[..., RunningChatgate],
                                                      fake: RunningFake, transport: str,
                                                      extra: dict[str, Any]) -> None:
    """The client gets exactly the bytes the fake wrote: keep-alives, every event, [DONE], nothing more."""
    gate = start_gate(upstream={"transport": transport})
    fake.state.configure(keepalive_count=2, chunk_delay=0.002)
    raw = read_all(gate, chat_body(stream=True, **extra))
    sent = bytes(fake.state.requests[0].sent)
    assert sent.startswith(b": keep-alive\n\n: keep-alive\n\ndata: {") and sent.endswith(b"data: [DONE]\n\n")
    assert len(data_events(sent)) > 5
    assert raw == sent


def test_usage_rides_on_the_last_chunk_and_is_metered_exactly(gate: RunningChatgate, fake: RunningFake,
                                                              tmp_path: Path) -> None:
    raw = read_all(gate, chat_body("Summarise the plot of Hamlet", stream=True))
    events = data_events(raw)
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"] == fake.state.requests[0].usage
    assert all("usage" not in e for e in events[:-1])
    (row,) = usage_rows(tmp_path, 1)
    usage = fake.state.requests[0].usage
    assert usage is not None
    assert (row["outcome"], row["stream"], row["tokens_exact"]) == ("ok", 1, 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"],
                                                                usage["completion_tokens"])
    assert row["reasoning_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"] > 0
    assert row["prompt_cache_hit_tokens"] == usage["prompt_cache_hit_tokens"]


def test_stream_without_usage_is_estimated(gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    """An upstream that only sends usage when asked, and nobody asked: counted locally, flagged estimated."""
    fake.state.configure(usage_mode="separate_when_asked")
    raw = read_all(gate, chat_body(stream=True))
    assert b'"usage"' not in raw
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["tokens_exact"]) == ("ok", 0)
    assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0


def test_chatgate_asks_for_usage_and_hides_it_from_a_client_that_did_not(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    fake.state.configure(usage_mode="separate_when_asked")
    gate = start_gate(upstream={"request_stream_usage": True})
    raw = read_all(gate, chat_body(stream=True, x_unknown_field={"kept": True}))
    sent = fake.state.requests[0].json
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["x_unknown_field"] == {"kept": True} and sent["messages"][0]["role"] == "user"
    assert b'"usage"' not in raw
    events = data_events(raw)
    assert events and all(e["choices"] for e in events)  # no usage-only chunk with empty choices
    assert raw.endswith(b"data: [DONE]\n\n")
    (row,) = usage_rows(tmp_path, 1)
    usage = fake.state.requests[0].usage
    assert usage is not None
    assert (row["tokens_exact"], row["completion_tokens"]) == (1, usage["completion_tokens"])


def test_client_that_asked_for_usage_still_gets_it(start_gate: Callable[..., RunningChatgate],
                                                   fake: RunningFake, tmp_path: Path) -> None:
    fake.state.configure(usage_mode="separate_when_asked")
    gate = start_gate(upstream={"request_stream_usage": True})
    with openai.OpenAI(base_url=gate.url + "/v1", api_key="sk-stream", max_retries=0) as client:
        chunks = list(client.chat.completions.create(
            model="deepseek-flash", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    issued = fake.state.requests[0].usage
    assert issued is not None and chunks[-1].usage.completion_tokens == issued["completion_tokens"]
    (row,) = usage_rows(tmp_path, 1)
    assert row["tokens_exact"] == 1


def test_client_disconnect_closes_upstream_and_is_metered(gate: RunningChatgate, fake: RunningFake,
                                                          tmp_path: Path) -> None:
    fake.state.configure(chunk_delay=0.2)
    seen = 0
    with open_stream(gate, chat_body("Write a long essay", stream=True)) as response:
        for line in response.iter_lines():
            seen += line.startswith("data: {")
            if seen == 3:
                break
    # leaving the block closed the connection; the upstream request must end now, not at its natural end
    assert fake.state.wait_idle(3.0)
    rec = fake.state.requests[0]
    assert rec.outcome == "client_disconnected"
    assert rec.usage is not None and rec.completion_tokens_sent < rec.usage["completion_tokens"]
    (row,) = usage_rows(tmp_path, 1)
    assert row["outcome"] == "client_disconnected"
    assert row["tokens_exact"] == 0
    assert row["completion_tokens"] > 0
    assert row["prompt_tokens"] > 0


def test_gateway_keeps_serving_after_a_disconnect(gate: RunningChatgate, fake: RunningFake) -> None:
    fake.state.configure(chunk_delay=0.1)
    with open_stream(gate, chat_body(stream=True)) as response:
        next(response.iter_raw())
    fake.state.configure(chunk_delay=0.0)
    raw = read_all(gate, chat_body(stream=True))
    assert raw.endswith(b"data: [DONE]\n\n")


def test_usage_request_leaves_odd_bodies_alone_when_validation_is_off(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    """validation.enabled = false: chatgate must not crash re-writing a body it never checked; the
    client's bytes go upstream and DeepSeek answers for itself (its deserializer refuses the list)."""
    gate = start_gate(upstream={"request_stream_usage": True}, validation={"enabled": False})
    body = orjson.dumps(chat_body(stream=True, stream_options=["include_usage"]))
    response = httpx2.post(gate.url + "/v1/chat/completions", content=body, headers=JSON_HEADERS, timeout=10)
    rec = fake.state.requests[0]
    assert rec.body == body
    assert rec.refused is not None and "stream_options: invalid type: sequence" in rec.refused
    assert response.status_code == 400 and response.json()["error"]["message"] == rec.refused
    usage_rows(tmp_path, 1)


def test_stream_carries_the_request_id_both_ways(gate: RunningChatgate, fake: RunningFake,
                                                 tmp_path: Path) -> None:
    with open_stream(gate, chat_body(stream=True), **{"x-request-id": "agent-run-7/step-3"}) as response:
        response.read()
        assert response.headers.get_list("x-request-id") == ["agent-run-7/step-3"]
        assert len(response.headers.get_list("date")) == 1  # ours only, DeepSeek's is not relayed twice
    assert fake.state.requests[0].request_id == "agent-run-7/step-3"
    (row,) = usage_rows(tmp_path, 1)
    assert row["request_id"] == "agent-run-7/step-3"


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_both_upstream_transports_relay_every_event_and_meter_it(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path, transport: str
) -> None:
    """The aiohttp transport is read straight from aiohttp's body reader, the others through httpx2's
    iterator: the client gets the same events either way, split across many small upstream writes."""
    gate = start_gate(upstream={"transport": transport})
    fake.state.configure(chunk_delay=0.002)
    body = chat_body("Tell me a story", stream=True)
    raw = read_all(gate, body)
    events = data_events(raw)
    assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"data: [DONE]") == 1
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == "".join(make_plan(body).content) != ""
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["tokens_exact"]) == ("ok", 1)


def test_both_upstream_clients_read_a_stream_through_one_answer_interface(fake: RunningFake) -> None:
    """aiohttp (the default) and httpx2's own transport hand back an `Answer` read the same way: what has
    arrived, then each chunk, then its end."""
    async def read(transport: str) -> tuple[type, bytes]:
        upstream = Upstream(UpstreamSettings(base_url=fake.url, transport=transport))  # type: ignore[arg-type]
        body = orjson.dumps(chat_body(stream=True))
        headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-probe")]
        try:
            answer = await upstream.send("POST", "/chat/completions", headers, body)
            content = await read_whole(answer, time.perf_counter() + 10)
            assert answer.at_eof()
            return type(answer), content
        finally:
            await upstream.aclose()

    (aio, aio_body), (httpx, httpx_body) = asyncio.run(read("aiohttp")), asyncio.run(read("httpx"))
    assert (aio, httpx) == (AiohttpAnswer, TransportAnswer)
    assert aio_body.endswith(b"data: [DONE]\n\n") and len(aio_body) == len(httpx_body)


def test_streams_that_end_normally_leave_the_upstream_connection_reusable(
        gate: RunningChatgate, fake: RunningFake) -> None:
    """The relay stops at the last event, then reads the end of the chunked body: the connection goes back
    to the pool (closing it would cost a new TCP and TLS handshake with DeepSeek per streamed request)."""
    late_end = {"x-fake-end-delay": "0.05"}  # the chunked body's end comes in a packet of its own
    for n in range(3):
        with open_stream(gate, chat_body(f"question {n}", stream=True), **late_end) as resp:
            assert resp.read().endswith(b"data: [DONE]\n\n")
        assert fake.state.wait_idle(5.0)
        time.sleep(0.1)  # chatgate reads the body's end once the client has the answer
    peers = {rec.peer for rec in fake.state.requests}
    assert len(fake.state.requests) == 3 and len(peers) == 1, peers
