"""What chatgate remembers from DeepSeek's chat answers: a thinking-mode turn that ends in tool calls (its
call ids, tool names and reasoning_content), from a completion body or from a relayed stream."""

from __future__ import annotations

from typing import Any

import orjson

from app.repair.base import Turn
from app.sse import SCAN_AT, take_lines


def turn_from_completion(data: Any) -> Turn | None:
    """The tool-call turn of a non-streaming answer, when it has one and reasoning to go with it."""
    try:
        message = data["choices"][0]["message"]
        calls = message.get("tool_calls")
        if not calls:  # most answers: no exception raised for them
            return None
        reasoning = message["reasoning_content"]
        ids = tuple([call["id"] for call in calls])
        names = tuple([str(call["function"].get("name", "")) for call in calls])
    except (KeyError, IndexError, TypeError, AttributeError):  # not the shape of a tool-call turn
        return None
    if not ids or not isinstance(reasoning, str) or not all(isinstance(i, str) for i in ids):
        return None
    return Turn(ids, names, reasoning)


class StreamedTurn:
    """Collects the tool calls of a relayed stream: the bytes are scanned in batches (as the meter does, not
    chunk by chunk), and only the data lines that carry `tool_calls` are parsed (a few per call); the
    reasoning comes from the stream meter at the end."""

    __slots__ = ("_buf", "_calls", "saw_reasoning")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._calls: dict[int, list[str]] = {}  # index -> [id, name]
        self.saw_reasoning = False

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > SCAN_AT:
            self._scan(final=False)

    def _scan(self, final: bool) -> None:
        batch = take_lines(self._buf, final)
        if not batch:
            return
        if not self.saw_reasoning and b'"reasoning_content":"' in batch:
            self.saw_reasoning = True
        if b'"tool_calls"' not in batch:  # most batches (the reasoning, the content): no line to look at
            return
        for line in batch.split(b"\n"):
            if b'"tool_calls"' in line and line.startswith(b"data:"):
                self._line(line[5:])

    def _line(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        choices = event.get("choices") if isinstance(event, dict) else None
        if not isinstance(choices, list):
            return
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            for call in (delta.get("tool_calls") or []) if isinstance(delta, dict) else []:
                if not isinstance(call, dict) or not isinstance(call.get("index"), int):
                    continue
                entry = self._calls.setdefault(call["index"], ["", ""])
                if isinstance(call.get("id"), str) and call["id"]:
                    entry[0] = call["id"]
                function = call.get("function")
                if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
                    entry[1] = function["name"]

    def turn(self, reasoning: str) -> Turn | None:
        self._scan(final=True)
        if not self._calls or not self.saw_reasoning:
            return None
        calls = [self._calls[i] for i in sorted(self._calls)]
        if not all(call_id for call_id, _ in calls):
            return None
        return Turn(tuple(c[0] for c in calls), tuple(c[1] for c in calls), reasoning)
