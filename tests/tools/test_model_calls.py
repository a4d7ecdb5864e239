"""The web searches and page reads a model makes with DeepSeek's server tools (`deepseek_web_search`,
`deepseek_read_url`), billed per successful call since 2026-11-01 00:00 Beijing (2026-10-31 16:00 UTC):
added to the request's record (cost = tokens + calls), read from the answer's usage where it says
(`usage.server_tool_use`, Anthropic's spelling, and the stand-in the fake emits for chat and Responses), else
counted from the result blocks and flagged estimated.

End to end on the Messages and Responses routes, which forward the server tools today. On chat, R30 still
refuses them on this branch (the `surface` branch makes them valid): there the stream and answer meters are
tested directly, and the end-to-end chat test belongs after that merge."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.anthropic.stream import MessagesMeter, calls_from_message
from chatgate.metering.calls import ModelCalls, server_tool_use
from chatgate.metering.pricing import call_cost
from chatgate.openai.chat import ChatFamily
from chatgate.openai.stream import ChatStreamMeter
from chatgate.responses.stream import ResponsesMeter, calls_from_response
from chatgate.settings import Settings
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate

KEY = "sk-test-client-0001"
CALL = 750_000_000
BILLED = dt.datetime(2026, 10, 31, 16, tzinfo=dt.UTC).timestamp()
USED = {"web_search_requests": 2, "web_fetch_requests": 1}


def test_the_per_call_prices_and_the_day_model_calls_became_billed() -> None:
    """The catalogue's per-call prices (chatgate/metering/catalogue.toml): USD where DeepSeek publishes one,
    yuan for every tool but ASR; a model's own calls free before 2026-11-01 00:00 Beijing."""
    assert call_cost("search", 1, BILLED, "USD") == call_cost("fetch", 1, BILLED, "USD") == CALL
    assert call_cost("search", 1000, BILLED, "USD") == 750 * 10**9  # $0.75 per 1,000
    assert call_cost("search", 1000, BILLED, "CNY") == 5 * 10**12  # 5 元 per 1,000
    assert call_cost("ocr", 10, BILLED + 30 * 86400, "USD") is None
    assert call_cost("tts", 10, BILLED + 30 * 86400, "USD") is None
    assert call_cost("ocr", 1000, BILLED + 30 * 86400, "CNY") == 1_500_000_000_000  # 1.5 元 per 1,000 pages
    assert call_cost("search", 2, BILLED - 0.001, "USD", made_by_model=True) == 0
    assert call_cost("search", 2, BILLED, "USD", made_by_model=True) == 2 * CALL


def test_the_usage_says_how_many_calls() -> None:
    assert server_tool_use({"server_tool_use": USED}) == ModelCalls(2, 1)
    assert server_tool_use({"server_tool_use": {"web_search_requests": -1, "x": 3}}) == ModelCalls()
    assert server_tool_use({"prompt_tokens": 3}) is None and server_tool_use(None) is None


def test_chat_answers_and_streams_are_metered_from_their_usage() -> None:
    family = ChatFamily(Settings().policy())
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "server_tool_use": USED}
    assert family.model_calls({"usage": usage}) == ModelCalls(2, 1)
    assert family.model_calls({"usage": {"prompt_tokens": 10}}) is None
    meter = ChatStreamMeter()
    meter.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    meter.feed(b'data: {"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\ndata: [DONE]\n\n")
    meter.finish()
    assert meter.usage is not None and meter.usage.prompt_tokens == 10
    assert meter.calls == ModelCalls(2, 1)


def test_messages_without_the_usage_count_the_result_blocks_as_an_estimate() -> None:
    results = [{"type": "web_search_result", "url": "https://example.com", "title": "t"}]
    message = {"content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "deepseek_web_search", "input": {}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": results},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_2", "content": []},  # no results: free
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_3",
         "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"}},
        {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_4",
         "content": {"type": "web_fetch_result"}},
        {"type": "text", "text": "a \"web_search_tool_result\" in text counts nothing"}],
        "usage": {"input_tokens": 3, "output_tokens": 2}}
    assert calls_from_message(message) == ModelCalls(1, 1, estimated=True)
    assert calls_from_message({**message, "usage": {"server_tool_use": USED}}) == ModelCalls(2, 1)
    meter = MessagesMeter()
    for block in message["content"]:
        meter.feed(b"event: content_block_start\ndata: " + orjson.dumps(
            {"type": "content_block_start", "index": 0, "content_block": block}) + b"\n\n")
    meter.feed(b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":2}}\n\n')
    meter.finish()
    assert meter.calls == ModelCalls(1, 1, estimated=True)


def test_responses_without_the_usage_count_the_completed_search_items_as_an_estimate() -> None:
    output = [{"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q"}},
              {"type": "web_search_call", "status": "completed", "action": {"type": "open_page", "url": "u"}},
              {"type": "web_search_call", "status": "completed", "action": {"type": "find_in_page"}},
              {"type": "web_search_call", "status": "failed", "action": {"type": "search"}},
              {"type": "message", "status": "completed", "content": []}]
    assert calls_from_response({"output": output}) == ModelCalls(1, 1, estimated=True)
    assert calls_from_response({"output": output, "usage": {"server_tool_use": USED}}) == ModelCalls(2, 1)
    assert calls_from_response({"output": []}) is None
    meter = ResponsesMeter()
    done = {"type": "response.completed", "response": {"output": output, "usage": {"input_tokens": 4}}}
    meter.feed(b"event: response.completed\ndata: " + orjson.dumps(done) + b"\n\n")
    meter.finish()
    assert meter.calls == ModelCalls(1, 1, estimated=True)


def messages(gate: RunningChatgate, stream: bool, used: dict[str, int] | None = None) -> httpx2.Response:
    body = {"model": "deepseek-flash", "max_tokens": 64, "stream": stream,
            "tools": [{"type": "deepseek_web_search", "name": "deepseek_web_search"}],
            "messages": [{"role": "user", "content": "What happened in Hangzhou today?"}]}
    headers = {"content-type": "application/json", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
    if used is not None:
        headers["x-fake-server-tool-use"] = orjson.dumps(used).decode()
    return httpx2.post(gate.url + "/anthropic/v1/messages", content=orjson.dumps(body), headers=headers,
                       timeout=20)


def responses(gate: RunningChatgate, stream: bool, used: dict[str, int]) -> httpx2.Response:
    body = {"model": "deepseek-flash", "stream": stream, "input": "What happened in Hangzhou today?",
            "tools": [{"type": "deepseek_web_search"}, {"type": "deepseek_read_url"}]}
    return httpx2.post(gate.url + "/v1/responses", content=orjson.dumps(body), timeout=20, headers={
        "content-type": "application/json", "authorization": f"Bearer {KEY}",
        "x-fake-server-tool-use": orjson.dumps(used).decode()})


def calls_of(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["route"], row["billed_units"], row["billed_unit"], row["billed_picousd"],
            bool(row["billed_estimated"]))


@pytest.mark.parametrize("stream", [False, True])
def test_the_messages_route_adds_the_models_calls_to_its_record(gate: RunningChatgate, fake: RunningFake,
                                                                tmp_path: Path, stream: bool) -> None:
    answer = messages(gate, stream, USED)
    assert answer.status_code == 200, answer.text
    plain = messages(gate, stream)
    assert plain.status_code == 200
    with_calls, without = usage_rows(tmp_path, 2)
    assert calls_of(with_calls) == ("/anthropic/v1/messages", 3, "call", 3 * CALL, False)
    # without the header the fake answers the declared tool with its stand-in (chatgate/demo/server_tools.py)
    tokens_cost = without["cost_picousd"] - without["billed_picousd"]
    assert tokens_cost > 0 and with_calls["cost_picousd"] == with_calls["billed_picousd"] + tokens_cost, \
        "cost = tokens + calls (the same tokens for the same body)"
    assert without["billed_picousd"] == without["billed_units"] * CALL
    metrics = httpx2.get(gate.url + "/metrics").text
    searches = 2 + without["billed_units"]  # the plain request declares the search tool only
    assert f'chatgate_billed_calls_total{{source="model",tool="search",unit="call"}} {searches}.0' in metrics
    assert 'chatgate_billed_calls_total{source="model",tool="fetch",unit="call"} 1.0' in metrics


@pytest.mark.parametrize("stream", [False, True])
def test_the_responses_route_adds_the_models_calls_to_its_record(gate: RunningChatgate, tmp_path: Path,
                                                                 stream: bool) -> None:
    answer = responses(gate, stream, {"web_search_requests": 4})
    assert answer.status_code == 200, answer.text
    [row] = usage_rows(tmp_path, 1)
    assert calls_of(row) == ("/responses", 4, "call", 4 * CALL, False)
    assert row["cost_picousd"] > row["billed_picousd"]


def test_model_calls_before_november_are_counted_and_free(start_gate: Callable[..., RunningChatgate],
                                                          tmp_path: Path) -> None:
    gate = start_gate()
    gate.state.gw.clock = lambda: BILLED - 60  # 2026-10-31 15:59 UTC: 23:59 in Beijing, the day before
    assert messages(gate, False, USED).status_code == 200
    [row] = usage_rows(tmp_path, 1)
    assert calls_of(row) == ("/anthropic/v1/messages", 3, "call", 0, False)


def chat(gate: RunningChatgate, stream: bool, used: dict[str, int]) -> httpx2.Response:
    body = {"model": "deepseek-flash", "stream": stream, "tools": [{"type": "deepseek_web_search"}],
            "messages": [{"role": "user", "content": "What happened in Hangzhou today?"}]}
    return httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(body), timeout=20, headers={
        "content-type": "application/json", "authorization": f"Bearer {KEY}",
        "x-fake-server-tool-use": orjson.dumps(used).decode()})


@pytest.mark.parametrize("stream", [False, True])
def test_the_chat_route_adds_the_models_calls_to_its_record(gate: RunningChatgate, tmp_path: Path,
                                                            stream: bool) -> None:
    answer = chat(gate, stream, USED)
    assert answer.status_code == 200, answer.text
    [row] = usage_rows(tmp_path, 1)
    assert calls_of(row) == ("/v1/chat/completions", 3, "call", 3 * CALL, False)


@pytest.mark.parametrize("stream", [False, True])
def test_the_chat_route_meters_the_calls_when_the_tools_are_let_through(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path, stream: bool) -> None:
    """Until the server tools are valid on chat (above), the chat path itself, with validation off on both
    sides: the answer's and the stream's usage give the calls."""
    fake.state.configure(validate=False)
    gate = start_gate(validation={"enabled": False})
    answer = chat(gate, stream, USED)
    assert answer.status_code == 200, answer.text
    [row] = usage_rows(tmp_path, 1)
    assert calls_of(row) == ("/v1/chat/completions", 3, "call", 3 * CALL, False)
    assert row["cost_picousd"] > 3 * CALL, "cost = tokens + calls"
