"""DeepSeek's Responses answers as chatgate relays them (docs/rules-responses.md#streams-and-usage):

- usage: `input_tokens` (cache hits included) with `input_tokens_details.cached_tokens` as the hits,
  `output_tokens` (reasoning included) with `output_tokens_details.reasoning_tokens`;
- the stream: `event:` + `data:` lines with a `sequence_number`, no `data: [DONE]`; it ends with
  `response.completed` or `response.incomplete` (each carrying the whole response, usage included) or
  `response.failed`; the meter keeps the streamed text for an estimate when the usage never comes;
- the turns chatgate remembers for responses_reasoning: the reasoning items of an answer that ends in calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from chatgate.metering.calls import ModelCalls, server_tool_use
from chatgate.metering.usage import TokenCounts
from chatgate.repair.base import Turn
from chatgate.sse import JSON_STRING, SCAN_AT, LineWatcher, data_lines_with, decode, take_lines

CALL_TYPES = ("function_call", "custom_tool_call")

# The terminal events whose data line ends the stream (the record is made before it is relayed). Inside a
# JSON string a quote is escaped, so this can only match a real "type" key (the event's own: nested items have
# other types). `response.failed` is not final here: the stream is then metered as DeepSeek's error when it
# closes.
_FINAL = re.compile(rb'"type"[ \t]*:[ \t]*"response\.(?:completed|incomplete)"')
_TERMINAL = re.compile(rb'"type"[ \t]*:[ \t]*"response\.(?:completed|incomplete|failed)"')
_DELTA = re.compile(rb'"delta"' + JSON_STRING)
_ERROR = re.compile(rb'[ \t]*\{[ \t]*"type"[ \t]*:[ \t]*"error"')  # an `error` event (no `event:` line)
_TEXT_DELTAS = (b"output_text.delta", b"function_call_arguments.delta", b"custom_tool_call_input.delta",
                b"refusal.delta")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def tokens_from_usage(usage: Any) -> TokenCounts | None:
    """input_tokens includes the cache hits (cached_tokens): miss = input - cached."""
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("input_tokens"))
    details = usage.get("input_tokens_details")
    hit = min(_count(details.get("cached_tokens")) if isinstance(details, dict) else 0, prompt)
    out_details = usage.get("output_tokens_details")
    reasoning = _count(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return TokenCounts(prompt, _count(usage.get("output_tokens")), hit, prompt - hit, reasoning)


def reasoning_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """What to remember of a reasoning item: the parts DeepSeek reads back (None if it has no text)."""
    content = item.get("content")
    if not isinstance(content, list) or not any(
            isinstance(c, dict) and isinstance(c.get("text"), str) and c["text"] for c in content):
        return None
    kept: dict[str, Any] = {k: item[k] for k in ("type", "id", "summary", "content", "encrypted_content")
                            if k in item}
    kept.setdefault("summary", [])
    return kept


def turn_of_items(output: Any) -> Turn | None:
    """The tool-call turn of an answer's output items, when it has reasoning with text to go with it."""
    if not isinstance(output, list):
        return None
    items = [o for o in output if isinstance(o, dict)]
    calls = [o for o in items if o.get("type") in CALL_TYPES]
    reasoning = [r for o in items if o.get("type") == "reasoning" and (r := reasoning_item(o)) is not None]
    if not calls or not reasoning:
        return None
    ids = tuple(str(c.get("call_id") or "") for c in calls)
    if not all(ids):
        return None
    return Turn(ids, tuple(str(c.get("name", "")) for c in calls), orjson.dumps(reasoning).decode())


def calls_from_response(response: Any) -> ModelCalls | None:
    """The server web tools' calls of a whole response: as its usage says (`usage.server_tool_use`), else
    counted from its completed `web_search_call` items (action `search`: a search; `open_page`: a page read)
    and flagged estimated; how DeepSeek reports them on this route is not documented."""
    if not isinstance(response, dict):
        return None
    said = server_tool_use(response.get("usage"))
    if said is not None:
        return said
    output = response.get("output")
    searches = fetches = 0
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict) or item.get("status") != "completed":
            continue
        kind = item.get("type")
        action = item.get("action")
        act = action.get("type") if isinstance(action, dict) else None
        if kind in ("web_search_call", "deepseek_web_search_call") and act in (None, "search"):
            searches += 1
        elif kind == "deepseek_read_url_call" or (kind == "web_search_call" and act == "open_page"):
            fetches += 1
    return ModelCalls(searches, fetches, estimated=True) if searches or fetches else None


def turn_from_response(answer: Any) -> Turn | None:
    return turn_of_items(answer.get("output")) if isinstance(answer, dict) else None


class ResponsesMeter:
    """Watches a relayed Responses stream. Work happens in batches (16 KB, and at the end); only the data
    line of a terminal event is parsed as JSON (for its usage), the deltas are found with regex scans."""

    def __init__(self, watcher: LineWatcher | None = None) -> None:
        self._buf = bytearray()
        self._watcher = watcher
        self._text: list[bytes] = []
        self._reasoning: list[bytes] = []
        self._last_type = b""
        self.usage: TokenCounts | None = None
        self.calls: ModelCalls | None = None  # the server web tools' calls (the terminal event's response)
        self.model: str | None = None  # the model DeepSeek says it served (the terminal event's response)

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > SCAN_AT:
            self._drain(final=False)

    def finish(self) -> None:
        self._drain(final=True)

    def final_in(self, lines: bytes) -> bool:
        return b"response." in lines and _FINAL.search(lines) is not None

    @property
    def text(self) -> str:
        return decode(self._text)

    @property
    def reasoning(self) -> str:
        return decode(self._reasoning)

    @property
    def ended_with_error(self) -> bool:
        return self._last_type in (b"response.failed", b"error")

    def _drain(self, final: bool) -> None:
        batch = take_lines(self._buf, final)
        if not batch:
            return
        if self._watcher is not None:
            self._watcher.lines(batch)
        for line in batch.split(b"\n"):
            if line.startswith(b"event:"):
                self._last_type = line[6:].strip()
            elif line.startswith(b"data:"):
                self._data(line[5:])

    def _data(self, payload: bytes) -> None:
        if _TERMINAL.search(payload) is not None:
            self._terminal(payload)
        elif b'delta"' in payload and (found := _DELTA.search(payload)) is not None:
            if b"reasoning_text.delta" in payload or b"reasoning_summary_text.delta" in payload:
                self._reasoning.append(found.group(1))
            elif any(kind in payload for kind in _TEXT_DELTAS):
                self._text.append(found.group(1))
        elif _ERROR.match(payload) is not None:
            self._last_type = b"error"

    def _terminal(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        response = event.get("response") if isinstance(event, dict) else None
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            self._last_type = event["type"].encode()
        if not isinstance(response, dict):
            return
        found = tokens_from_usage(response.get("usage"))
        if found is not None:
            self.usage = found
        self.calls = calls_from_response(response)
        if isinstance(response.get("model"), str) and response["model"]:
            self.model = response["model"]


class ResponsesStreamedTurn:
    """Collects the calls and reasoning items of a relayed stream from its `response.output_item.done` lines
    (each carries a whole item), in the lines its meter takes; the reasoning text of the meter stands in
    where no reasoning item came."""

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}

    def lines(self, batch: bytes) -> None:
        for payload in data_lines_with(batch, b"output_item.done"):
            self._line(payload)

    def _line(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict) or event.get("type") != "response.output_item.done":
            return
        item = event.get("item")
        index = event.get("output_index")
        if isinstance(item, dict):
            self._items[index if isinstance(index, int) else len(self._items)] = item

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        items = [self._items[k] for k in sorted(self._items)]
        if items and not any(i.get("type") == "reasoning" for i in items) and (text := reasoning()):
            items.insert(0, {"type": "reasoning", "summary": [],
                             "content": [{"type": "reasoning_text", "text": text}]})
        return turn_of_items(items)
