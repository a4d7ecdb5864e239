"""What a request's history says about its run, read without hashing the history itself.

An agent resends its whole history every round: the request after request E holds E's items, then E's
answer (the model's turn: an assistant message, or the Responses API's output items), then what the agent
adds (tool results, the user's next words). A model's turn is unique to its round (its tool calls' ids are
DeepSeek's, one per call), so a history is printed as a chain: the hash of the item before the first answer
(the task), then each answer's signature (its tool call ids, else its text) in turn. The request whose
history holds k answers, the last at position p, continues the request whose print is (p, chain of the
first k - 1); its own print is (len(items), chain of all k). Only the answers and one item are read: the
prefix they stand on is the same by construction (equal tool call ids are answers to equal histories).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

_xx = xxhash.xxh3_64_intdigest
_dumps = orjson.dumps
_role = operator.itemgetter("role")
OUTPUT_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call", "reasoning",
                          "web_search_call", "file_search_call", "computer_call", "mcp_call",
                          "image_generation_call"})


@dataclass(slots=True)
class Calls:
    """The tool calls of one answer: their names in order, and one hash of names and arguments together."""

    names: tuple[str, ...]
    same: int  # equal for the same calls with the same arguments


NO_CALLS = Calls((), 0)


@dataclass(slots=True)
class Shape:
    """A request's history as runs read it. `after`: the print of the request it continues (None: it
    continues none; it opens a run); `own`: its own print; `calls`: the tool calls of the answer it carries
    back (the last one); `finish`: why that answer ended, as it shows (tool_calls or stop)."""

    after: tuple[int, int] | None
    own: tuple[int, int]
    calls: Calls
    finish: str | None


def _text(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", "replace")
    return _dumps(content) if content is not None else b""


# --- the families' answers ---------------------------------------------------------------------------------


def _chat_sig(item: dict[str, Any]) -> tuple[bytes, Calls]:
    calls = item.get("tool_calls")
    if isinstance(calls, list) and calls:
        ids, names, same = [], [], []
        for call in calls:
            if type(call) is not dict:
                continue
            ids.append(str(call.get("id")))
            function = call.get("function")
            name = function.get("name") if type(function) is dict else None
            names.append(name if isinstance(name, str) else "?")
            same.append(_dumps(function) if function is not None else b"")
        return "\x00".join(ids).encode(), Calls(tuple(names), _xx(b"\x00".join(same)))
    return _text(item.get("content")), NO_CALLS


def _anthropic_sig(item: dict[str, Any]) -> tuple[bytes, Calls]:
    content = item.get("content")
    if isinstance(content, list):
        ids, names, same, texts = [], [], [], []
        for block in content:
            if type(block) is not dict:
                continue
            kind = block.get("type")
            if kind in ("tool_use", "server_tool_use"):
                ids.append(str(block.get("id")))
                name = block.get("name")
                names.append(name if isinstance(name, str) else "?")
                same.append(_dumps([name, block.get("input")]))
            elif kind == "text":
                texts.append(_text(block.get("text")))
        if ids:
            return "\x00".join(ids).encode(), Calls(tuple(names), _xx(b"\x00".join(same)))
        return b"\x00".join(texts), NO_CALLS
    return _text(content), NO_CALLS


def _responses_sig(items: list[Any]) -> tuple[bytes, Calls]:
    ids, names, same, texts = [], [], [], []
    for item in items:
        if item.get("call_id") is not None:
            ids.append(str(item.get("call_id")))
            name = item.get("name") or item.get("type")
            names.append(name if isinstance(name, str) else "?")
            same.append(_dumps([name, item.get("arguments", item.get("input", item.get("action")))]))
        elif item.get("role") == "assistant":
            texts.append(_text(item.get("content")))
    if ids:
        return "\x00".join(ids).encode(), Calls(tuple(names), _xx(b"\x00".join(same)))
    return b"\x00".join(texts), NO_CALLS


def _answers_by_role(items: list[Any]) -> list[int]:
    """Where the assistant messages are (consecutive ones are one answer: their first)."""
    try:
        roles = list(map(_role, items))
    except (KeyError, TypeError):
        roles = [i.get("role") if type(i) is dict else None for i in items]
    if "assistant" not in roles:
        return []
    return [i for i, r in enumerate(roles) if r == "assistant" and (i == 0 or roles[i - 1] != "assistant")]


def _is_output(item: Any) -> bool:
    return type(item) is dict and (item.get("type") in OUTPUT_TYPES or item.get("role") == "assistant")


def shape(kind: str, items: list[Any], caller: str, opens: bool) -> Shape | None:
    """The request's `Shape`. None: no items, or no answer in them and it does not open a run (`opens`: it
    offers tools, as an agent's first request does; a plain chat's first request is left alone)."""
    if not items:
        return None
    if kind == "responses":
        outputs = [i for i, item in enumerate(items) if _is_output(item)]
        starts = [i for i in outputs if i == 0 or not _is_output(items[i - 1])]
    else:
        starts = _answers_by_role(items)
    if not starts and not opens:
        return None
    first = starts[0] if starts else len(items)
    task = items[first - 1] if first > 0 else items[0]
    try:
        chain = _xx(caller.encode("utf-8", "replace") + b"\x00" + _dumps(task))
    except TypeError:
        return None
    prints: list[tuple[int, int]] = []
    calls, finish = NO_CALLS, None
    for j, start in enumerate(starts):
        stop = starts[j + 1] if j + 1 < len(starts) else len(items)
        if kind == "responses":
            group = [items[i] for i in range(start, stop) if _is_output(items[i])]
            sig, calls = _responses_sig(group)
        elif kind == "anthropic":
            sig, calls = _anthropic_sig(items[start])
        else:
            sig, calls = _chat_sig(items[start])
        prints.append((start, chain))
        chain = _xx(chain.to_bytes(8, "little") + sig)
    if starts:
        finish = "tool_calls" if calls.names else "stop"
    return Shape(prints[-1] if prints else None, (len(items), chain), calls, finish)


def items_of(kind: str) -> Callable[[dict[str, Any]], Any]:
    name = "input" if kind == "responses" else "messages"
    return lambda data: data.get(name)


def kind_of(upstream_path: str) -> str | None:
    """The family a route's history is read as (None: a route without one)."""
    if upstream_path.endswith("/chat/completions"):
        return "chat"
    if upstream_path.endswith("/messages"):
        return "anthropic"
    if upstream_path.endswith("/responses"):
        return "responses"
    return None
