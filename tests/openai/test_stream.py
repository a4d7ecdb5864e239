"""The chat family's stream meter: usage from whichever chunk carries it, the streamed text for estimates,
the stream's end, whatever the chunking; and the stripper of the usage the client did not ask for."""

from __future__ import annotations

import json

import orjson
import pytest

from chatgate.metering.usage import TokenCounts
from chatgate.openai.stream import ChatStreamMeter, UsageStripper
from tests.metering.test_pricing_usage import DEEPSEEK_USAGE

# --- StreamMeter ----------------------------------------------------------------------------------


def sse(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"id": "c1", "object": "chat.completion.chunk", "model": "deepseek-flash",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def feed_split(meter: ChatStreamMeter, data: bytes, size: int) -> None:
    """Feed in awkward pieces, like TCP does (a line can be cut anywhere)."""
    for start in range(0, len(data), size):
        meter.feed(data[start:start + size])
    meter.finish()


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_meter_finds_usage_on_the_last_content_chunk(piece: int) -> None:
    stream = (b": keep-alive\n\n" + sse(chunk({"role": "assistant", "content": ""}))
              + sse(chunk({"content": "Hello"})) + sse(chunk({"content": ""}, "stop", usage=DEEPSEEK_USAGE))
              + b"data: [DONE]\n\n")
    meter = ChatStreamMeter()
    feed_split(meter, stream, piece)
    assert meter.usage == TokenCounts(120, 45, 64, 56, 30)
    assert meter.done


def test_meter_finds_usage_on_a_separate_usage_only_chunk() -> None:
    """OpenAI style: stream_options.include_usage -> a final chunk with choices [] carries usage."""
    stream = (sse(chunk({"content": "Hi"}, usage=None)) + sse(chunk({"content": ""}, "stop", usage=None))
              + sse({"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": DEEPSEEK_USAGE})
              + b"data: [DONE]\n\n")
    meter = ChatStreamMeter()
    feed_split(meter, stream, 13)
    assert meter.usage == TokenCounts(120, 45, 64, 56, 30)


def test_meter_collects_text_reasoning_and_tool_calls_when_usage_is_absent() -> None:
    function = {"name": "get_weather", "arguments": ""}
    call = {"index": 0, "id": "call_1", "type": "function", "function": function}
    stream = (sse(chunk({"role": "assistant", "content": None, "reasoning_content": ""}))
              + sse(chunk({"content": None, "reasoning_content": "Think"}))
              + sse(chunk({"content": None, "reasoning_content": "ing."}))
              + sse(chunk({"content": "Sunny"})) + sse(chunk({"content": " today"}))
              + sse(chunk({"tool_calls": [call]}))
              + sse(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}]}))
              + sse(chunk({"content": ""}, "tool_calls")) + b"data: [DONE]\n\n")
    meter = ChatStreamMeter()
    feed_split(meter, stream, 5)
    assert meter.usage is None
    assert meter.reasoning == "Thinking."
    assert meter.text == "Sunny todayget_weather{\"city\":\"Oslo\"}"
    assert meter.done


@pytest.mark.parametrize("order", ["reasoning first", "text first"])
@pytest.mark.parametrize("thoughts", [2, 3000])  # all in the last batch, or most in earlier batches
def test_the_reasoning_alone_is_read_for_a_turn_and_the_rest_when_asked(order: str, thoughts: int) -> None:
    """A tool-call turn asks the meter for its reasoning only: the last batch's content and tool calls are
    read when something asks for them (an estimate, a kept text), and nothing is read twice."""
    stream = b"".join(sse(chunk({"content": None, "reasoning_content": f"t{i} "})) for i in range(thoughts))
    stream += sse(chunk({"content": "Sunny"})) + sse(chunk({"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}))
    stream += sse(chunk({"content": ""}, "tool_calls")) + b"data: [DONE]\n\n"
    meter = ChatStreamMeter()
    feed_split(meter, stream, 700)
    thought = "".join(f"t{i} " for i in range(thoughts))
    if order == "reasoning first":
        assert meter.reasoning == thought
        assert meter._pending and b"Sunny" not in b"".join(meter._text_raw)  # the content is not read yet
    assert meter.text == "Sunnyf{}"
    assert meter.reasoning == thought and meter.reasoning == thought
    assert meter.text == "Sunnyf{}" and meter.done


def test_meter_handles_streams_larger_than_its_compaction_threshold() -> None:
    """Past its threshold the meter parses as it goes; a line cut at a chunk boundary must not be lost."""
    body = b"".join(sse(chunk({"content": f"w{i} "})) for i in range(3000))
    stream = body + sse(chunk({"content": ""}, "stop", usage=DEEPSEEK_USAGE)) + b"data: [DONE]\n\n"
    meter = ChatStreamMeter()
    feed_split(meter, stream, 1000)
    assert meter.text == "".join(f"w{i} " for i in range(3000))
    assert meter.usage == TokenCounts(120, 45, 64, 56, 30)


def test_meter_tolerates_a_stream_cut_mid_line() -> None:
    stream = sse(chunk({"content": "partial"})) + b'data: {"id": "c1", "choi'
    meter = ChatStreamMeter()
    feed_split(meter, stream, 8)
    assert meter.text == "partial" and meter.usage is None and not meter.done


def test_meter_decodes_escapes_and_unicode_in_the_kept_text() -> None:
    """The text is kept JSON-escaped and decoded once: quotes, backslashes, newlines, emoji, CJK survive."""
    args = '{"path": "C:\\\\tmp\\\\a.txt", "note": "say \\"hi\\"\\n"}'
    stream = (sse(chunk({"content": "你好 \"quoted\" \\ back\nslash 😀"}))
              + sse(chunk({"tool_calls": [{"index": 0, "function": {"name": "write", "arguments": args}}]}))
              + b"data: " + json.dumps(chunk({"content": " ascii-escaped é"})).encode() + b"\n\n"
              + b"data: [DONE]\n\n")
    meter = ChatStreamMeter()
    feed_split(meter, stream, 3)
    assert meter.text == "你好 \"quoted\" \\ back\nslash 😀" + " ascii-escaped é" + "write" + args
    assert meter.done and not meter.ended_with_error


def test_meter_ignores_key_names_quoted_inside_content() -> None:
    text = 'a "content": "x" and "usage": {"prompt_tokens": 9}'
    stream = sse(chunk({"content": text})) + b"data: [DONE]\n\n"
    meter = ChatStreamMeter()
    feed_split(meter, stream, 4096)
    assert meter.text == text
    assert meter.usage is None


@pytest.mark.parametrize("piece", [5, 40000])
def test_meter_sees_a_stream_that_ends_with_deepseeks_error_event(piece: int) -> None:
    error = {"error": {"message": "Service busy", "type": "server_error", "code": "overloaded"}}
    body = b"".join(sse(chunk({"content": f"w{i} "})) for i in range(400))
    meter = ChatStreamMeter()
    feed_split(meter, body + sse(error), piece)
    assert meter.ended_with_error and not meter.done
    meter = ChatStreamMeter()
    feed_split(meter, sse(error) + body + b"data: [DONE]\n\n", piece)
    assert not meter.ended_with_error and meter.done


@pytest.mark.parametrize(("lines", "final"), [
    (b"data: [DONE]\n", True),
    (b"data:[DONE]\r\n", True),
    (sse(chunk({"content": "x"})) + b"data: [DONE]\n\n", True),
    # a streamed text may hold the same bytes (a model writing about SSE): not the end of the stream
    (sse(chunk({"content": "it ends with data: [DONE] and then"})), False),
    (sse(chunk({"content": "data: [DONE]"})), False),
])  # fmt: skip
def test_the_end_of_the_stream_is_a_done_line_of_its_own(lines: bytes, final: bool) -> None:
    assert ChatStreamMeter().final_in(lines) is final


# --- UsageStripper --------------------------------------------------------------------------------


def stripped(stream: bytes, size: int) -> tuple[bytes, list[bytes]]:
    """The stream through a stripper in pieces of `size` bytes; and what it returned for each piece."""
    stripper = UsageStripper()
    outs = [stripper.feed(stream[start:start + size]) for start in range(0, len(stream), size)]
    return b"".join(outs), outs


@pytest.mark.parametrize("piece", [1, 7, 64, 4096])
def test_the_stripper_removes_the_usage_chatgate_asked_for_and_nothing_else(piece: int) -> None:
    text = [sse(chunk({"role": "assistant", "content": ""}))] + [
        sse(chunk({"content": f"word {k} "})) for k in range(40)]
    stream = (b": keep-alive\n\n" + b"".join(text) + sse(chunk({"content": ""}, "stop", usage=None))
              + sse({"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": DEEPSEEK_USAGE})
              + b"data: [DONE]\n\n")
    out, _ = stripped(stream, piece)
    events = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: {")]
    # the usage-only chunk is gone, and the `"usage": null` that include_usage adds to the others
    assert len(events) == 42 and all("usage" not in e for e in events)
    assert out.replace(b"\n\n\n", b"\n\n").endswith(b"data: [DONE]\n\n")
    assert out.startswith(b": keep-alive\n\n" + b"".join(text)), "the lines before it pass unchanged"


def test_the_stripper_removes_usage_from_deepseeks_last_content_chunk() -> None:
    last = sse(chunk({"content": ""}, "stop", usage=DEEPSEEK_USAGE))
    out, _ = stripped(sse(chunk({"content": "Hi"})) + last + b"data: [DONE]\n\n", 10_000)
    events = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: {")]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, "stop"]
    assert "usage" not in events[1]


def test_the_stripper_passes_chunks_without_usage_as_they_came() -> None:
    lines = sse(chunk({"content": 'a "usage" word'})) + sse(chunk({"content": "more"}))
    out, outs = stripped(lines, len(lines))
    assert outs == [lines] and outs[0] is lines, "whole lines without usage: the same bytes, not a copy"
    out, outs = stripped(lines[:-5] + b"\n", len(lines))  # (a line the stream cut is held back whole)
    assert out == lines[:-5] + b"\n"
