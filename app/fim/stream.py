"""The FIM completion stream as chatgate relays it: `text_completion` chunks whose text is in
`choices[].text` (not a `delta`), usage on the last chunk, `data: [DONE]` at the end (DOC-fim).

The meter works like the chat meter (app/openai/stream.py): regex scans over 16 KB batches, the streamed text
kept as raw JSON-escaped strings for a local estimate, only events carrying `usage` parsed as JSON.
"""

from __future__ import annotations

import re

import orjson

from app.metering.usage import TokenCounts, tokens_from_usage
from app.openai.stream import ends_stream
from app.sse import JSON_STRING, SCAN_AT, collect, data_lines_with, decode, take_lines

_TEXT = re.compile(rb'"text"' + JSON_STRING)
_LAST_DATA = re.compile(rb"^data:[ \t]*(\{.*)$", re.MULTILINE)


class FimStreamMeter:
    """Watches relayed FIM SSE bytes: finds the chunk carrying `usage`, keeps `choices[].text` for
    estimates, notes `[DONE]` and whether the last event was an error."""

    __slots__ = ("_buf", "_last_event", "_text_raw", "done", "usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._text_raw: list[bytes] = []
        self._last_event = b""
        self.usage: TokenCounts | None = None
        self.done = False

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > SCAN_AT:
            self._drain(final=False)

    def finish(self) -> None:
        self._drain(final=True)

    def final_in(self, lines: bytes) -> bool:
        return ends_stream(lines)

    @property
    def model(self) -> str | None:
        return None

    @property
    def text(self) -> str:
        return decode(self._text_raw)

    @property
    def reasoning(self) -> str:
        return ""  # FIM is non-thinking only

    @property
    def ended_with_error(self) -> bool:
        try:
            event = orjson.loads(self._last_event) if self._last_event else None
        except orjson.JSONDecodeError:
            return False
        return isinstance(event, dict) and "error" in event

    def _drain(self, final: bool) -> None:
        batch = take_lines(self._buf, final)
        if not batch:
            return
        collect(self._text_raw, _TEXT.findall(batch))
        if b'"usage":{' in batch or b'"usage": {' in batch:
            for payload in data_lines_with(batch, b'"usage"'):
                self._usage_line(payload)
        if not self.done and b"[DONE]" in batch:
            self.done = any(line.strip() == b"[DONE]" for line in data_lines_with(batch, b"[DONE]"))
        last = _LAST_DATA.match(batch, max(batch.rfind(b"\ndata: {"), batch.rfind(b"\ndata:{")) + 1)
        if last is not None:
            self._last_event = last.group(1).rstrip()

    def _usage_line(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        found = tokens_from_usage(event.get("usage")) if isinstance(event, dict) else None
        if found is not None:
            self.usage = found
