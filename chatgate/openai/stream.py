"""The chat family's SSE stream as chatgate relays it: the meter that finds `usage` and keeps the streamed
text for estimates, and the stripper that hides usage the client did not ask for."""

from __future__ import annotations

import re

import orjson

from chatgate.metering.calls import ModelCalls, server_tool_use
from chatgate.metering.usage import TokenCounts, tokens_from_usage
from chatgate.sse import (
    JSON_STRING,
    SCAN_AT,
    LineWatcher,
    collect,
    data_lines_with,
    decode,
    has_line,
    take_lines,
)

# The stream's end: a line of its own (the same bytes inside a streamed text are not one).
_DONE_LINE = re.compile(rb"data:[ \t]*\[DONE\][ \t]*\r?")


def ends_stream(lines: bytes) -> bool:
    """Whether these complete lines hold the `data: [DONE]` line."""
    return has_line(lines, b"[DONE]", _DONE_LINE)


# The streamed text is needed only for an estimate (a stream that ends without `usage`), so it is kept as
# the raw JSON-escaped string values, found by regex scans over each batch, and decoded once at the end.
# Inside a JSON string a quote is always escaped, so `"content":"` can only match a real key. Each pattern
# starts with a literal, which the regex engine searches for fast; the rarer ones run only when a cheap
# substring test says they can match.
_CONTENT = re.compile(rb'"content"' + JSON_STRING)
_REASONING = re.compile(rb'"reasoning_content"' + JSON_STRING)
_TOOL = re.compile(rb'"(?:name|arguments)"' + JSON_STRING)
_LAST_DATA = re.compile(rb"^data:[ \t]*(\{.*)$", re.MULTILINE)


class ChunkMeter:
    """What the meters of OpenAI's chunk streams (chat completions, FIM) share: the bytes gathered into
    batches, the chunk carrying `usage`, `data: [DONE]`, whether the last event was an error. A subclass
    collects its streamed text from each batch in `_scan`, then calls `_scan_end`.

    Work happens in batches (when 16 KB have gathered, and once at the end), never per chunk, and costs a
    few regex scans per batch: no event is parsed as JSON unless it carries `usage` or ends the stream. The
    last batch (all of a short stream) is searched for `usage` only, from its end; its text, its `[DONE]`
    and its last event are scanned when asked for (`_settle`: an estimate, a kept text, a tool-call turn,
    `done`, `ended_with_error`), which a stream with usage and no tool call never does.
    """

    __slots__ = ("_buf", "_done", "_last_event", "_pending", "_text_raw", "calls", "usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._text_raw: list[bytes] = []
        self._last_event = b""  # the payload of the last JSON event seen
        self._pending = b""  # the last batch, searched for usage only so far
        self.usage: TokenCounts | None = None
        self.calls: ModelCalls | None = None  # the server web tools' calls, as the usage says
        self._done = False  # saw data: [DONE]

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
    def done(self) -> bool:
        """The stream's `data: [DONE]` line was seen."""
        self._settle()
        return self._done

    @property
    def ended_with_error(self) -> bool:
        """The last event was an `error` object (DeepSeek's own)."""
        self._settle()
        try:
            event = orjson.loads(self._last_event) if self._last_event else None
        except orjson.JSONDecodeError:
            return False
        return isinstance(event, dict) and "error" in event

    def _drain(self, final: bool) -> None:
        batch = take_lines(self._buf, final)
        if batch:
            self._take(batch, final)

    def _take(self, batch: bytes, final: bool) -> None:
        self._find_usage(batch)
        if final:
            self._pending = batch
        else:
            self._scan(batch)

    def _settle(self) -> None:
        """Scan the last batch, kept for when its text or its end is asked for."""
        if self._pending:
            batch, self._pending = self._pending, b""
            self._scan(batch)

    def _scan(self, batch: bytes) -> None:
        raise NotImplementedError

    def _find_usage(self, batch: bytes) -> None:
        """The usage of the batch's last `data:` line that carries a usage object (the stream's last chunks;
        searched from the end, a `"usage":null` line is passed over unparsed)."""
        at = batch.rfind(b'"usage"')
        while at >= 0:
            start = batch.rfind(b"\n", 0, at) + 1
            end = batch.find(b"\n", at)
            line = batch[start:end if end >= 0 else len(batch)]
            if line.startswith(b"data:") and (b'"usage":{' in line or b'"usage": {' in line) \
                    and self._usage_line(line[5:]):
                return
            at = batch.rfind(b'"usage"', 0, start)

    def _scan_end(self, batch: bytes) -> None:
        """The batch's `[DONE]` and last event."""
        if not self._done and b"[DONE]" in batch:
            self._done = any(line.strip() == b"[DONE]" for line in data_lines_with(batch, b"[DONE]"))
        last = _LAST_DATA.match(batch, max(batch.rfind(b"\ndata: {"), batch.rfind(b"\ndata:{")) + 1)
        if last is not None:
            self._last_event = last.group(1).rstrip()

    def _usage_line(self, payload: bytes) -> bool:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        found = tokens_from_usage(event.get("usage")) if isinstance(event, dict) else None
        if found is not None:
            self.usage = found
            self.calls = server_tool_use(event["usage"])
        return found is not None


class ChatStreamMeter(ChunkMeter):
    """The chat stream's meter: its content, reasoning and tool calls kept for estimates; `watcher` (the
    turn collector) sees each batch of lines."""

    __slots__ = ("_reasoning_raw", "_reasoning_read", "_tool_raw", "_watcher")

    def __init__(self, watcher: LineWatcher | None = None) -> None:
        # the base's fields set here too: one call fewer per streamed request than super().__init__()
        self._buf = bytearray()
        self._watcher = watcher
        self._text_raw: list[bytes] = []
        self._reasoning_raw: list[bytes] = []
        self._reasoning_read = False  # the last batch's reasoning is collected (its other text is not yet)
        self._tool_raw: list[bytes] = []
        self._last_event = b""
        self._pending = b""
        self.usage: TokenCounts | None = None
        self.calls: ModelCalls | None = None
        self._done = False

    @property
    def text(self) -> str:
        """Content, then tool names and arguments."""
        self._settle()
        return decode(self._text_raw) + decode(self._tool_raw)

    @property
    def reasoning(self) -> str:
        """The streamed reasoning. Of the last batch only the reasoning is read: a tool-call turn (restore's
        memory) asks for nothing else, and the content and tool scans cost it more than its own."""
        pending = self._pending
        if pending and not self._reasoning_read:
            self._reasoning_read = True
            if b'"reasoning_content"' in pending:
                collect(self._reasoning_raw, _REASONING.findall(pending))
        return decode(self._reasoning_raw)

    def _drain(self, final: bool) -> None:
        batch = take_lines(self._buf, final)
        if not batch:
            return
        if self._watcher is not None:
            self._watcher.lines(batch)
        self._take(batch, final)

    def _scan(self, batch: bytes) -> None:
        collect(self._text_raw, _CONTENT.findall(batch))
        if not self._reasoning_read and b'"reasoning_content"' in batch:  # (read: the last batch's, already)
            collect(self._reasoning_raw, _REASONING.findall(batch))
        if b'"tool_calls"' in batch:
            collect(self._tool_raw, _TOOL.findall(batch))
        self._scan_end(batch)


class UsageStripper:
    """Removes from the client's stream the usage chatgate asked for and the client did not."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        if data.find(b'"usage"', 0, cut) < 0:  # most chunks: relayed as they came, with no line looked at
            return data if cut == len(data) else data[:cut]
        return b"".join([self._line(line) for line in data[:cut].splitlines(keepends=True)])

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data: {") or b'"usage"' not in line:
            return line
        try:
            event = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            return line
        if event.get("choices") == [] and event.get("usage") is not None:
            return b""  # the separate usage-only chunk, and its blank separator stays harmless
        event.pop("usage", None)
        return b"data: " + orjson.dumps(event) + b"\n"
