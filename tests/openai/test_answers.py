"""What chatgate remembers from chat answers: the tool-call turn of a completion body or of a stream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from chatgate.openai.answers import ChatStreamedTurn, turn_from_completion
from chatgate.openai.stream import ChatStreamMeter
from chatgate.repair.base import Turn
from chatgate.sse import SCAN_AT


def completion(message: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_a_thinking_tool_call_answer_is_a_turn() -> None:
    message = {"role": "assistant", "content": None, "reasoning_content": "think",
               "tool_calls": [call("c1", "search"), call("c2", "read")]}
    assert turn_from_completion(completion(message)) == Turn(("c1", "c2"), ("search", "read"), "think")


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": "done", "reasoning_content": "think"},  # no tool calls: most answers
    {"role": "assistant", "content": "done", "reasoning_content": "think", "tool_calls": []},
    {"role": "assistant", "content": None, "tool_calls": [call("c1", "search")]},  # no reasoning
    {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": [call("c1", "search")]},
    {"role": "assistant", "reasoning_content": "think", "tool_calls": [{"type": "function"}]},  # no id
    {"role": "assistant", "reasoning_content": "think", "tool_calls": [{"id": 7, "function": {}}]},
    {"role": "assistant", "reasoning_content": "think", "tool_calls": {"id": "c1"}},
    "not a message",
    None,
])
def test_other_answers_are_not_turns(message: Any) -> None:
    assert turn_from_completion(completion(message)) is None


@pytest.mark.parametrize("data", [{}, {"choices": []}, {"choices": "x"}, [], None, "text"])
def test_answers_without_a_message_are_not_turns(data: Any) -> None:
    assert turn_from_completion(data) is None


def event(delta: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"


def watched(stream: bytes, step: int) -> tuple[ChatStreamedTurn, ChatStreamMeter]:
    """The stream relayed in chunks of `step` bytes through a meter that the turn collector watches, as the
    proxy does."""
    turns = ChatStreamedTurn()
    meter = ChatStreamMeter(turns)
    for n in range(0, len(stream), step):
        meter.feed(stream[n:n + step])
    meter.finish()
    return turns, meter


def never() -> str:
    raise AssertionError("the reasoning is asked for only when there is a turn")


def test_a_streamed_turn_is_collected_across_chunk_boundaries() -> None:
    stream = (event({"reasoning_content": "thi"}) + event({"reasoning_content": "nk"})
              + event({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                       "function": {"name": "search", "arguments": ""}}]})
              + event({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
              + b"data: [DONE]\n\n")
    turns, meter = watched(stream, 7)  # split anywhere, lines included
    assert turns.turn(lambda: meter.reasoning) == Turn(("c1",), ("search",), "think")


def test_a_stream_without_reasoning_or_calls_is_no_turn() -> None:
    calls = event({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]})
    no_reasoning, _ = watched(calls, 99)
    assert no_reasoning.turn(never) is None
    no_calls, _ = watched(event({"reasoning_content": "think"}) + event({"content": "done"}), 99)
    assert no_calls.turn(never) is None
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    finish_only, _ = watched(event({"reasoning_content": "think"}) + finish, 99)
    assert finish_only.turn(never) is None, "a finish reason named tool_calls is no call"


def test_a_call_on_the_chunk_that_ends_the_turn_is_collected() -> None:
    last = {"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {"tool_calls": [
        {"index": 0, "id": "c9", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}}]}
    turns, _ = watched(event({"reasoning_content": "think"}) + b"data: " + orjson.dumps(last) + b"\n\n", 99)
    assert turns.turn(lambda: "think") == Turn(("c9",), ("grep",), "think")


@pytest.mark.parametrize("step", [1, 7, 4096, 20_000, 10**6])
def test_a_long_streamed_turn_is_collected_whatever_the_chunks(step: int) -> None:
    """Streams are scanned in batches of SCAN_AT bytes: calls in several batches, with lines cut at batch
    and chunk ends, are all found."""
    thinking = b"".join(event({"reasoning_content": f"step {k} of a long plan. "}) for k in range(900))
    calls = b"".join(event({"tool_calls": [{"index": k, "id": f"call_{k}", "type": "function",
                                           "function": {"name": f"tool_{k}", "arguments": ""}}]})
                     + thinking[:thinking.index(b"\n\n", SCAN_AT // 3) + 2] for k in range(4))
    stream = thinking + calls + b"data: [DONE]"  # no final newline
    assert len(stream) > 3 * SCAN_AT
    turns, _ = watched(stream, step)
    assert turns.turn(lambda: "plan") == Turn(("call_0", "call_1", "call_2", "call_3"),
                                      ("tool_0", "tool_1", "tool_2", "tool_3"), "plan")
