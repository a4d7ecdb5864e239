"""The Messages stream as chatgate relays it: usage from message_start and message_delta (input_tokens
excludes cache reads), the served model, the end, the text for estimates, the tool-use turn remembered."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from chatgate.anthropic.stream import (
    MessagesMeter,
    StreamedThinkingTurn,
    tokens_from_usage,
    turn_from_message,
)
from chatgate.metering.usage import TokenCounts


def event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps({"type": name, **payload}) + b"\n\n"


STREAM = b"".join([
    b": keep-alive\n\n",
    event("message_start", {"message": {"id": "8c1f", "type": "message", "role": "assistant", "content": [],
                                        "model": "deepseek-v4-pro", "stop_reason": None,
                                        "usage": {"input_tokens": 40, "cache_read_input_tokens": 256,
                                                  "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta",
                                                        "thinking": "Read the "}}),
    event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta",
                                                        "thinking": "test \"x\"."}}),
    event("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "8c1f"}}),
    event("content_block_stop", {"index": 0}),
    event("ping", {}),
    event("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
    event("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Reading it."}}),
    event("content_block_stop", {"index": 1}),
    event("content_block_start", {"index": 2, "content_block": {"type": "tool_use", "id": "call_7",
                                                                "name": "Read", "input": {}}}),
    event("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta",
                                                        "partial_json": "{\"file_path\": "}}),
    event("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta",
                                                        "partial_json": "\"a.py\"}"}}),
    event("content_block_stop", {"index": 2}),
    event("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 57}}),
    event("message_stop", {}),
])


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_usage_model_text_and_end_whatever_the_chunking(size: int) -> None:
    meter = MessagesMeter()
    for at in range(0, len(STREAM), size):
        meter.feed(STREAM[at:at + size])
    meter.finish()
    assert meter.usage == TokenCounts(296, 57, 256, 40, 0)
    assert meter.model == "deepseek-v4-pro"
    assert meter.reasoning == 'Read the test "x".'
    assert meter.text == 'Reading it.{"file_path": "a.py"}'
    assert meter.final_in(event("message_stop", {})) and not meter.final_in(event("message_delta", {}))
    assert not meter.ended_with_error


def test_a_stream_ending_with_an_error_event() -> None:
    meter = MessagesMeter()
    start = STREAM.index(b"event: content_block_start")
    meter.feed(STREAM[:start] + b'event: error\ndata: {"type":"error","error":{"type":"api_error"}}\n\n')
    meter.finish()
    assert meter.ended_with_error


def test_the_streamed_tool_use_turn_with_its_thinking_signature() -> None:
    turns = StreamedThinkingTurn()
    meter = MessagesMeter(turns)
    for at in range(0, len(STREAM), 11):
        meter.feed(STREAM[at:at + 11])
    meter.finish()
    turn = turns.turn(lambda: meter.reasoning)
    assert turn is not None and turn.call_ids == ("call_7",) and turn.names == ("Read",)
    assert json.loads(turn.payload) == [{"type": "thinking", "thinking": 'Read the test "x".',
                                         "signature": "8c1f"}]


def test_the_tool_use_turn_of_a_whole_message() -> None:
    message = {"content": [{"type": "thinking", "thinking": "why", "signature": "s"},
                           {"type": "tool_use", "id": "call_1", "name": "Bash", "input": {}},
                           {"type": "tool_use", "id": "call_2", "name": "Read", "input": {}}]}
    turn = turn_from_message(message)
    assert turn is not None and turn.call_ids == ("call_1", "call_2") and turn.names == ("Bash", "Read")
    assert json.loads(turn.payload) == [{"type": "thinking", "thinking": "why", "signature": "s"}]
    assert turn_from_message({"content": [{"type": "tool_use", "id": "c", "name": "n", "input": {}}]}) is None
    assert turn_from_message({"content": "text"}) is None


def test_input_tokens_exclude_cache_reads() -> None:
    usage = {"input_tokens": 33, "cache_read_input_tokens": 256, "output_tokens": 12}
    assert tokens_from_usage(usage) == TokenCounts(289, 12, 256, 33, 0)
    assert tokens_from_usage(None) is None


def test_the_end_of_the_stream_is_a_message_stop_line_of_its_own() -> None:
    meter = MessagesMeter()
    delta = {"type": "text_delta", "text": "x\\nevent: message_stop y"}
    text = event("content_block_delta", {"delta": delta})
    assert not meter.final_in(text)
    assert meter.final_in(b"event:message_stop\r\ndata: {}\r\n")
