"""chatgate/sse.py: the byte-level scanning every family's stream meter uses."""

from __future__ import annotations

import re

import orjson

from chatgate.sse import JSON_STRING, collect, data_lines_with, decode, has_line, take_lines

CONTENT = re.compile(rb'"content"' + JSON_STRING)


def test_json_string_captures_escaped_values_split_across_batches_and_decode_joins_them() -> None:
    texts = ['He said "hi"\n', "caf\u00e9 \\ \u2603", "\U0001f600 end"]
    batches = [b"data: " + orjson.dumps({"delta": {"content": t}}) + b"\n\n" for t in texts]
    parts: list[bytes] = []
    for batch in batches:
        collect(parts, CONTENT.findall(batch))
        assert len(parts) == 1  # kept as one piece however long the stream
    assert decode(parts) == "".join(texts)


def test_decode_of_a_piece_cut_mid_escape_keeps_what_it_can() -> None:
    assert decode([b"abc\\u26"]) == "abc\\u26"
    assert decode([]) == ""


def test_data_lines_with_returns_only_data_payloads_that_contain_the_needle() -> None:
    batch = (b'event: x\ndata: {"usage": 1}\n\n: keep-alive "usage"\n\ndata: {"a": 2}\n\n'
             b'data: {"usage": 3}')
    assert data_lines_with(batch, b'"usage"') == [b' {"usage": 1}', b' {"usage": 3}']
    assert data_lines_with(batch, b"[DONE]") == []


def test_take_lines_takes_the_complete_lines_and_leaves_the_rest() -> None:
    buf = bytearray(b"data: 1\n\ndata: 2\ndata: 3 (cut")
    assert take_lines(buf, final=False) == b"data: 1\n\ndata: 2\n"
    assert buf == bytearray(b"data: 3 (cut")
    assert take_lines(buf, final=False) == b"" and buf == bytearray(b"data: 3 (cut")
    assert take_lines(buf, final=True) == b"data: 3 (cut" and buf == bytearray()


def test_has_line_finds_only_a_whole_line_and_agrees_with_the_anchored_multiline_pattern() -> None:
    anchored = re.compile(rb"^data:[ \t]*\[DONE\][ \t]*\r?$", re.M)
    line = re.compile(rb"data:[ \t]*\[DONE\][ \t]*\r?")
    cases = [b"data: [DONE]\n\n", b"data:[DONE]\r\n", b"data: [DONE]", b"x\ndata: [DONE] \n",
             b'data: {"content": "data: [DONE]"}\n\n', b"data: [DONE]x\n", b": [DONE]\ndata: [DONE]\n",
             b"", b"[DONE]", b'data: {"a": 1}\n\n' * 50 + b"data: [DONE]\n\n"]
    for lines in cases:
        assert has_line(lines, b"[DONE]", line) == (anchored.search(lines) is not None), lines
