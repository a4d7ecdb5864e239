"""The Responses stream as chatgate relays it: the meter finds the usage in `response.completed` (or
`.incomplete`), says which lines end the stream (never the `event:` line before the data), keeps the streamed
text for an estimate, and knows DeepSeek's own failure; the turn of a stream or a body is remembered with its
reasoning items. Streams come from the fake DeepSeek, cut at every kind of boundary."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from chatgate.demo import responses as fake
from chatgate.metering.usage import TokenCounts
from chatgate.responses.stream import (
    ResponsesMeter,
    ResponsesStreamedTurn,
    tokens_from_usage,
    turn_from_response,
)
from tests.responses.items import SHELL, user

BODY = {"model": "deepseek-flash", "input": [user("Weather in Oslo?")], "tools": [SHELL]}
TEXT_BODY = {"model": "deepseek-flash", "input": "Hello"}


def stream_of(body: dict[str, Any]) -> tuple[bytes, dict[str, Any], fake.ResponsePlan]:
    plan = fake.make_plan(body)
    usage = fake.make_usage(orjson.dumps(body), plan)
    events = fake.stream_events("resp_1", body, plan, usage)
    return b": keep-alive\n\n" + b"".join(e.data for e in events), usage, plan


def relay(raw: bytes, size: int) -> tuple[ResponsesMeter, int | None]:
    """Feed the meter as the relay does (chunks; final_in on complete lines); where it saw the end."""
    meter = ResponsesMeter()
    partial = b""
    ended = None
    for at in range(0, len(raw), size):
        chunk = raw[at:at + size]
        meter.feed(chunk)
        data = partial + chunk
        cut = data.rfind(b"\n") + 1
        partial, lines = data[cut:], data[:cut]
        if ended is None and meter.final_in(lines):
            ended = at
            meter.finish()
    meter.finish()
    return meter, ended


def test_usage_maps_cached_tokens_to_hits_and_reasoning_tokens() -> None:
    usage = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 640}, "output_tokens": 90,
             "output_tokens_details": {"reasoning_tokens": 60}, "total_tokens": 1090}
    assert tokens_from_usage(usage) == TokenCounts(1000, 90, 640, 360, 60)
    assert tokens_from_usage({"input_tokens": 5, "output_tokens": 1}) == TokenCounts(5, 1, 0, 5, 0)
    assert tokens_from_usage(None) is None


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("body", [BODY, TEXT_BODY], ids=["tool-call", "text"])
def test_the_meter_finds_the_usage_and_the_end_at_any_chunking(size: int, body: dict[str, Any]) -> None:
    raw, usage, _ = stream_of(body)
    meter, ended = relay(raw, size)
    assert meter.usage == tokens_from_usage(usage)
    assert ended is not None
    completed_data = raw.rindex(b"data: {")
    assert ended + size > completed_data + 1, "the end is the completed event's data line, not before it"
    assert not meter.ended_with_error


def test_the_meter_keeps_the_streamed_text_for_an_estimate() -> None:
    raw, _, _ = stream_of(TEXT_BODY)
    cut = raw[:raw.index(b"event: response.completed")]
    meter, ended = relay(cut, 50)
    assert ended is None and meter.usage is None
    assert meter.text == "Answer 1: the fake DeepSeek says hello."
    assert meter.reasoning == "The user sent 1 items; I will answer."
    tool, _, _ = stream_of(BODY)
    meter, _ = relay(tool[:tool.index(b"event: response.completed")], 50)
    assert meter.text == '{"q": "x"}'


def test_an_incomplete_response_ends_the_stream_with_its_usage() -> None:
    raw, usage, plan = stream_of({**TEXT_BODY, "max_output_tokens": 5})
    assert plan.incomplete and b"event: response.incomplete" in raw
    meter, ended = relay(raw, 100)
    assert ended is not None and meter.usage == tokens_from_usage(usage)


def test_a_failed_response_is_deepseeks_error_and_not_the_final_line() -> None:
    failed = {"type": "response.failed", "sequence_number": 3,
              "response": {"id": "resp_1", "status": "failed", "error": {"code": "server_error"},
                           "usage": None}}
    raw = b"event: response.failed\ndata: " + orjson.dumps(failed) + b"\n\n"
    meter, ended = relay(raw, 1000)
    assert ended is None and meter.ended_with_error and meter.usage is None
    meter, _ = relay(b'data: {"type":"error","code":"server_error","message":"x","sequence_number":2}\n\n', 9)
    assert meter.ended_with_error


def test_text_that_looks_like_a_terminal_event_does_not_end_the_stream() -> None:
    delta = {"type": "response.output_text.delta", "delta": '"type":"response.completed" delta"',
             "sequence_number": 4}
    raw = b"event: response.output_text.delta\ndata: " + orjson.dumps(delta) + b"\n\n"
    meter, ended = relay(raw, 1000)
    assert ended is None and meter.text == '"type":"response.completed" delta"'


def test_a_streamed_tool_call_turn_is_remembered_with_its_reasoning_item() -> None:
    raw, _, plan = stream_of(BODY)
    turns = ResponsesStreamedTurn()
    meter = ResponsesMeter(turns)
    for at in range(0, len(raw), 13):
        meter.feed(raw[at:at + 13])
    meter.finish()
    turn = turns.turn(lambda: "ignored: the reasoning item came")
    call = plan.items[1]
    assert turn is not None and turn.call_ids == (call.call_id,) and turn.names == ("shell",)
    remembered = orjson.loads(turn.payload)
    assert remembered == [{"type": "reasoning", "id": f"rs_{plan.items[0].id}", "summary": [],
                           "content": [{"type": "reasoning_text", "text": plan.items[0].text}]}]


def test_a_stream_without_reasoning_items_uses_the_meters_text() -> None:
    done = {"type": "response.output_item.done", "output_index": 0,
            "item": {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"}}
    turns = ResponsesStreamedTurn()
    meter = ResponsesMeter(turns)
    meter.feed(b"event: response.output_item.done\ndata: " + orjson.dumps(done) + b"\n\n")
    meter.finish()
    turn = turns.turn(lambda: "thinking hard")
    assert turn is not None and orjson.loads(turn.payload)[0]["content"][0]["text"] == "thinking hard"
    assert ResponsesStreamedTurn().turn(lambda: "x") is None, "no calls: nothing to remember"


def test_the_turn_of_a_body_needs_calls_and_reasoning_text() -> None:
    plan = fake.make_plan(BODY)
    body = fake.response_json("resp_1", {**BODY, "include": ["reasoning.encrypted_content"]}, plan, None)
    turn = turn_from_response(body)
    assert turn is not None and turn.call_ids == (plan.items[1].call_id,)
    assert orjson.loads(turn.payload)[0]["encrypted_content"].endswith("-0"), "DeepSeek's own handle is kept"
    text = fake.response_json("resp_2", TEXT_BODY, fake.make_plan(TEXT_BODY), None)
    assert turn_from_response(text) is None
    no_thinking = {**BODY, "reasoning": {"effort": "none"}}
    assert turn_from_response(fake.response_json("r", no_thinking, fake.make_plan(no_thinking), None)) is None
