"""DeepSeek's Anthropic-format answers as chatgate relays them: usage (input_tokens excludes cache reads,
docs/rules-anthropic.md#deepseeks-answers-on-this-route), the model DeepSeek served, the end of the stream
(`message_stop`), the streamed text for estimates, and the tool-use turns chatgate remembers for
restore_thinking."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from chatgate.metering.calls import ModelCalls, server_tool_use
from chatgate.metering.usage import TokenCounts
from chatgate.repair.base import Turn
from chatgate.sse import JSON_STRING, LineWatcher, data_lines_with, decode, has_line

_STOP_LINE = re.compile(rb"event:[ \t]*message_stop[ \t]*\r?")  # a line of its own, not text


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def tokens_from_usage(usage: Any) -> TokenCounts | None:
    """prompt = input_tokens + cache_read_input_tokens (cache reads are hits); DeepSeek does not break
    thinking out of output_tokens."""
    if not isinstance(usage, dict):
        return None
    miss = _count(usage.get("input_tokens")) + _count(usage.get("cache_creation_input_tokens"))
    hit = _count(usage.get("cache_read_input_tokens"))
    return TokenCounts(miss + hit, _count(usage.get("output_tokens")), hit, miss, 0)


def result_calls(block: Any) -> ModelCalls | None:
    """One content block's search or page read: a `web_search_tool_result` with results, a
    `web_fetch_tool_result` with a page (not an error)."""
    if not isinstance(block, dict):
        return None
    kind, content = block.get("type"), block.get("content")
    if kind == "web_search_tool_result" and isinstance(content, list) and content:
        return ModelCalls(1, 0, estimated=True)
    if kind == "web_fetch_tool_result" and isinstance(content, dict) \
            and not str(content.get("type", "")).endswith("_error"):
        return ModelCalls(0, 1, estimated=True)
    return None


def calls_from_message(message: Any) -> ModelCalls | None:
    """The server web tools' calls of a whole answer: as its usage says (`usage.server_tool_use`, as in
    Anthropic's API), else counted from its result blocks and flagged estimated."""
    if not isinstance(message, dict):
        return None
    said = server_tool_use(message.get("usage"))
    if said is not None:
        return said
    content = message.get("content")
    found = ModelCalls()
    for block in content if isinstance(content, list) else ():
        if (one := result_calls(block)) is not None:
            found = found + one
    return found if found.total else None


def turn_from_message(message: Any) -> Turn | None:
    """The tool-use turn of a non-streaming answer, with the thinking blocks that go with it."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return None
    calls = [b for b in content if isinstance(b, dict) and b.get("type") in ("tool_use", "server_tool_use")]
    thinking = [b for b in content if isinstance(b, dict) and b.get("type") == "thinking"
                and isinstance(b.get("thinking"), str)]
    if not calls or not thinking:
        return None
    ids = tuple(str(b.get("id", "")) for b in calls)
    if not all(ids):
        return None
    blocks = [{k: b[k] for k in ("type", "thinking", "signature") if k in b} for b in thinking]
    return Turn(ids, tuple(str(b.get("name", "")) for b in calls), orjson.dumps(blocks).decode())


_TEXT = re.compile(rb'"(?:text|partial_json)"' + JSON_STRING)
_THINKING = re.compile(rb'"thinking"' + JSON_STRING)


class MessagesMeter:
    """Watches a relayed Messages stream. Usage sits in `message_start` and `message_delta` (the latter
    supersedes the former, field by field); those two lines are parsed, the rest scanned with regexes."""

    def __init__(self, watcher: LineWatcher | None = None) -> None:
        self._tail = b""
        self._watcher = watcher
        self._text: list[bytes] = []
        self._thinking: list[bytes] = []
        self._usage: dict[str, Any] = {}
        self.model: str | None = None
        self._last_event = b""
        self._results = ModelCalls()  # the result blocks seen (content_block_start carries them whole)

    @property
    def usage(self) -> TokenCounts | None:
        return tokens_from_usage(self._usage) if self._usage else None

    @property
    def calls(self) -> ModelCalls | None:
        said = server_tool_use(self._usage)
        if said is not None:
            return said
        return self._results if self._results.total else None

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        if cut:
            self._scan(data[:cut])

    def finish(self) -> None:
        if self._tail:
            self._scan(self._tail)
            self._tail = b""

    def final_in(self, lines: bytes) -> bool:
        return has_line(lines, b"message_stop", _STOP_LINE)

    @property
    def text(self) -> str:
        return decode(self._text)

    @property
    def reasoning(self) -> str:
        return decode(self._thinking)

    @property
    def ended_with_error(self) -> bool:
        return self._last_event == b"error"

    def _scan(self, lines: bytes) -> None:
        if self._watcher is not None:
            self._watcher.lines(lines)
        self._text.extend(_TEXT.findall(lines))
        if lines.find(b'"thinking"') >= 0:
            self._thinking.extend(_THINKING.findall(lines))
        for payload in data_lines_with(lines, b'"usage"'):  # message_start and message_delta only
            self._usage_line(payload)
        if lines.find(b"_tool_result") >= 0:
            for payload in data_lines_with(lines, b"content_block_start"):
                self._block_start(payload)
        # The last event line (a JSON string escapes its newlines, so "\nevent:" always starts a line).
        at = lines.rfind(b"\nevent:") + 1
        if at or lines.startswith(b"event:"):
            end = lines.find(b"\n", at)
            self._last_event = lines[at + 6:end if end >= 0 else len(lines)].strip()

    def _block_start(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        found = result_calls(event.get("content_block")) if isinstance(event, dict) else None
        if found is not None:
            self._results = self._results + found

    def _usage_line(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        message = event.get("message") if event.get("type") == "message_start" else None
        usage = message.get("usage") if isinstance(message, dict) else event.get("usage")
        if isinstance(message, dict) and isinstance(message.get("model"), str):
            self.model = message["model"]
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})


class StreamedThinkingTurn:
    """Collects a relayed stream's tool_use blocks and the thinking signature (from `content_block_start`
    and `signature_delta` lines only, in the lines its meter takes); the thinking text comes from the
    meter."""

    def __init__(self) -> None:
        self._calls: list[tuple[str, str]] = []
        self._thinking = False
        self._signature = ""

    def lines(self, batch: bytes) -> None:
        if batch.find(b"content_block_start") < 0 and batch.find(b"signature_delta") < 0:
            return
        for line in batch.split(b"\n"):  # in order: a signature is the sum of its deltas
            if line.startswith(b"data:") and (b"content_block_start" in line or b"signature_delta" in line):
                self._line(line[5:])

    def _line(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        block = event.get("content_block")
        delta = event.get("delta")
        if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
            self._calls.append((str(block.get("id", "")), str(block.get("name", ""))))
        elif isinstance(block, dict) and block.get("type") == "thinking":
            self._thinking = True
            if isinstance(block.get("signature"), str):
                self._signature = block["signature"]
        elif isinstance(delta, dict) and delta.get("type") == "signature_delta":
            self._signature += str(delta.get("signature", ""))

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        if not self._calls or not self._thinking or not all(call_id for call_id, _ in self._calls):
            return None
        block: dict[str, Any] = {"type": "thinking", "thinking": reasoning()}
        if self._signature:
            block["signature"] = self._signature
        return Turn(tuple(c[0] for c in self._calls), tuple(c[1] for c in self._calls),
                    orjson.dumps([block]).decode())
