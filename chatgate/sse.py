"""Scanning relayed SSE bytes without parsing every event: what the stream meters of every API family share.

A meter sees the raw bytes it relays, in batches; it finds JSON string values with a regex (`JSON_STRING`
after a key) in batches of `SCAN_AT` bytes, keeps the escaped pieces (`collect`) and decodes them once at
the end (`decode`), and parses only the rare `data:` lines that carry what it needs (`data_lines_with`).
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

# `"key"` + JSON_STRING matches `"key": "value"` and captures the value, escapes and all.
JSON_STRING = rb'[ \t]*:[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"'
SCAN_AT = 16 * 1024  # bytes a meter buffers before scanning them (2,000 long streams hold at most ~32 MB)
# The text a meter keeps of one kind (content, reasoning, tool arguments), for the estimate of a stream
# without usage: more than any answer of DeepSeek's holds (384K tokens); beyond, the rest is not kept (an
# upstream that streams text without end cost memory without bound: issue 48).
TEXT_KEPT = 8 * 1024 * 1024


class LineWatcher(Protocol):
    """Sees the complete lines a meter takes, batch by batch (what a meter's caller also wants to find in
    the stream, e.g. the tool calls of a turn to remember), so the stream is buffered and split once."""

    def lines(self, batch: bytes) -> None: ...


def collect(parts: list[bytes], found: list[bytes]) -> None:
    """Add a batch's pieces, keeping `parts` one joined piece (a long stream makes one bytes, not many), of
    at most TEXT_KEPT bytes."""
    if found and not (parts and len(parts[0]) >= TEXT_KEPT):
        parts.append(b"".join(found))
        if len(parts) > 1 or len(parts[0]) > TEXT_KEPT:
            parts[:] = [b"".join(parts)[:TEXT_KEPT]]


def take_lines(buf: bytearray, final: bool) -> bytes:
    """Take the complete lines gathered in `buf` out of it (all of it at the stream's end); b"" if none."""
    cut = len(buf) if final else buf.rfind(b"\n") + 1
    lines = bytes(buf[:cut])
    del buf[:cut]
    return lines


def data_lines_with(batch: bytes, needle: bytes) -> list[bytes]:
    """The payloads of the `data:` lines that contain `needle` (rare: callers test for it first)."""
    out = []
    at = batch.find(needle)
    while at >= 0:
        start = batch.rfind(b"\n", 0, at) + 1
        end = batch.find(b"\n", at)
        end = len(batch) if end < 0 else end
        line = batch[start:end]
        if line.startswith(b"data:"):
            out.append(line[5:])
        at = batch.find(needle, end)
    return out


def has_line(lines: bytes, needle: bytes, line: re.Pattern[bytes]) -> bool:
    """Whether a line of `lines` that contains `needle` is, whole, a match of `line` (a pattern without
    anchors). Cheaper than one `^…$` pattern with re.M, which the regex engine tries at every byte. Searched
    from the end, where a stream's last line is."""
    at = lines.rfind(needle)
    while at >= 0:
        start = lines.rfind(b"\n", 0, at) + 1
        end = lines.find(b"\n", at)
        end = len(lines) if end < 0 else end
        if line.fullmatch(lines, start, end):
            return True
        at = lines.rfind(needle, 0, start)
    return False


def decode(parts: list[bytes]) -> str:
    """JSON-escaped pieces -> text; a piece cut by a broken stream is decoded as far as it goes."""
    raw = b"".join(parts)
    try:
        text = orjson.loads(b'"' + raw + b'"')
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")
    return text if isinstance(text, str) else ""
