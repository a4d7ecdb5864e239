"""What chatgate remembers from DeepSeek's chat answers: a thinking-mode turn that ends in tool calls (its
call ids, tool names and reasoning_content), from a completion body or from a relayed stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from chatgate.repair.base import Turn
from chatgate.sse import data_lines_with


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


class ChatStreamedTurn:
    """Collects the tool calls of a relayed stream from the batches of lines its meter takes (no copy of the
    stream of its own): only the data lines that carry `tool_calls` are parsed (a few per call); the
    reasoning comes from the meter at the end."""

    __slots__ = ("_calls", "saw_reasoning")

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}  # index -> [id, name]
        self.saw_reasoning = False

    def lines(self, batch: bytes) -> None:
        if not self.saw_reasoning and batch.find(b'"reasoning_content":"') >= 0:
            self.saw_reasoning = True
        for payload in data_lines_with(batch, b'"tool_calls"'):  # none in most batches (reasoning, content)
            if payload.count(b'"tool_calls"') > payload.count(b'"finish_reason":"tool_calls"'):  # not the end
                self._line(payload)

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

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        if not self._calls or not self.saw_reasoning:
            return None
        calls = [self._calls[i] for i in sorted(self._calls)]
        if not all(call_id for call_id, _ in calls):
            return None
        return Turn(tuple(c[0] for c in calls), tuple(c[1] for c in calls), reasoning())
