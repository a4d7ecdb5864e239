"""What a request's history says about its run, read without hashing the history itself.

An agent resends its whole history every round: the request after request E holds E's items, then E's
answer (the model's turn: an assistant message, or the Responses API's output items), then what the agent
adds (tool results, the user's next words). A model's turn is unique to its round (its tool calls' ids are
DeepSeek's, one per call), so a request's print is its length, its task (the item before the first answer)
and its last answer's signature (its tool call ids, else its text): the request whose last answer starts at
position p continues the request whose print is (p, the task, the answer before). Reading a round costs the
same however long the history is: the roles (in C), the task's JSON and two answers.
"""

from __future__ import annotations

import operator
from typing import Any

import orjson
import xxhash

_xx = xxhash.xxh3_64_intdigest
_dumps = orjson.dumps
_role = operator.itemgetter("role")
OUTPUT_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call", "reasoning",
                          "web_search_call", "file_search_call", "computer_call", "mcp_call",
                          "image_generation_call"})


Calls = tuple[tuple[str, ...], int]
"""The tool calls of one answer: their names in order, and one hash of names and arguments together (equal
for the same calls with the same arguments)."""
NO_CALLS: Calls = ((), 0)

Shape = tuple[tuple[int, int] | None, tuple[int, int], tuple[str, ...] | None, int]
"""A request's history as runs read it, `(after, own, names, same)`: the print of the request it continues
(None: it continues none; it opens a run), its own print, the tool calls of the answer it carries back (the
last one: None when it carries none, () when that answer called no tool) and one hash of their names and
arguments. A plain tuple: one is made for every request read."""


def _text(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", "replace")
    return _dumps(content) if content is not None else b""


# --- the families' answers ---------------------------------------------------------------------------------


def _name(value: Any) -> str:
    return value if isinstance(value, str) else "?"


def _chat_answer(item: Any, last: bool) -> tuple[bytes, Calls]:
    """An assistant message's signature (its tool call ids, else its text), and (`last`) its tool calls."""
    if type(item) is not dict:
        return b"", NO_CALLS
    calls = item.get("tool_calls")
    if type(calls) is list and len(calls) == 1 and type(call := calls[0]) is dict and "id" in call:
        ids = str(call["id"]).encode()
        if not last:
            return ids, NO_CALLS
        function = call.get("function")
        name = _name(function.get("name") if type(function) is dict else None)
        return ids, ((name,), _xx(_dumps([function])))
    if type(calls) is list and calls:
        try:
            ids = "\x00".join([str(call["id"]) for call in calls]).encode()
        except (KeyError, TypeError):
            return _dumps(calls), NO_CALLS
        if not last:
            return ids, NO_CALLS
        functions = [call.get("function") if type(call) is dict else None for call in calls]
        names = tuple(_name(f.get("name") if type(f) is dict else None) for f in functions)
        return ids, (names, _xx(_dumps(functions)))
    return _text(item.get("content")), NO_CALLS


def _chat_sig(item: Any) -> tuple[bytes, bool]:
    """`_chat_answer`'s signature of an answer that is not the last, and whether it called tools (its
    calls' names and arguments are not read)."""
    if type(item) is not dict:
        return b"", False
    calls = item.get("tool_calls")
    if type(calls) is list and len(calls) == 1 and type(call := calls[0]) is dict and "id" in call:
        return str(call["id"]).encode(), True
    if type(calls) is list and calls:
        try:
            return "\x00".join([str(call["id"]) for call in calls]).encode(), True
        except (KeyError, TypeError):
            return _dumps(calls), False
    return _text(item.get("content")), False


def _anthropic_sig(item: Any) -> tuple[bytes, bool]:
    content = item.get("content") if type(item) is dict else None
    called = type(content) is list and any(
        type(b) is dict and b.get("type") in ("tool_use", "server_tool_use") for b in content)
    return _anthropic_answer(item, False)[0], called


def _anthropic_answer(item: Any, last: bool) -> tuple[bytes, Calls]:
    if type(item) is not dict:
        return b"", NO_CALLS
    content = item.get("content")
    if type(content) is not list:
        return _text(content), NO_CALLS
    uses = [b for b in content if type(b) is dict and b.get("type") in ("tool_use", "server_tool_use")]
    if not uses:
        return b"\x00".join([_text(b.get("text")) for b in content
                             if type(b) is dict and b.get("type") == "text"]), NO_CALLS
    ids = "\x00".join([str(b.get("id")) for b in uses]).encode()
    if not last:
        return ids, NO_CALLS
    names = tuple(_name(b.get("name")) for b in uses)
    return ids, (names, _xx(_dumps([[b.get("name"), b.get("input")] for b in uses])))


def _responses_answer(group: list[Any], last: bool) -> tuple[bytes, Calls]:
    calls = [i for i in group if i.get("call_id") is not None]
    if not calls:
        texts = [_text(i.get("content")) for i in group if i.get("role") == "assistant"]
        return b"\x00".join(texts), NO_CALLS
    ids = "\x00".join([str(i.get("call_id")) for i in calls]).encode()
    if not last:
        return ids, NO_CALLS
    names = tuple(_name(i.get("name") or i.get("type")) for i in calls)
    same = _xx(_dumps([[i.get("name"), i.get("arguments", i.get("input", i.get("action")))] for i in calls]))
    return ids, (names, same)


def _roles(items: list[Any]) -> list[Any]:
    try:
        return list(map(_role, items))
    except (KeyError, TypeError):
        return [i.get("role") if type(i) is dict else None for i in items]


def _is_output(item: Any) -> bool:
    return type(item) is dict and (item.get("type") in OUTPUT_TYPES or item.get("role") == "assistant")


ANCHOR_SCAN = 64  # items looked back through for the last answer that called tools


def _anchor(kind: str, items: list[Any], roles: list[Any], upto: int) -> bytes:
    """The tool call ids of the last answer at or before `upto` that called tools (b"": none near): what
    tells apart two runs whose text answers are the same words."""
    signature = _chat_sig if kind == "chat" else _anthropic_sig
    for j in range(upto, max(upto - ANCHOR_SCAN, -1), -1):
        if roles[j] == "assistant":
            sig, called = signature(items[j])
            if called:
                return sig
    return b""


def no_history(data: dict[str, Any]) -> bool:
    """A chat request whose messages hold no answer and that offers no tools: no run of its own making
    (a plain chat's first request), told in a few steps."""
    if data.get("tools"):
        return False
    items = data.get("messages")
    try:
        return type(items) is list and "assistant" not in map(_role, items)
    except (KeyError, TypeError):
        return False


def shape(kind: str, items: list[Any], caller: str, opens: bool) -> Shape | None:
    """The request's `Shape`. None: no items, or no answer in them and it does not open a run (`opens`: it
    offers tools, as an agent's first request does; a plain chat's first request is left alone).

    Only the task (the item before the first answer) and the last two answers are read: a request's own
    print is (its items, its task and its last answer's signature); the print of the request it continues
    is (where its last answer starts, its task and the answer before). Tool call ids are DeepSeek's, one per
    call: two runs never share an answer's signature, so the history before it need not be hashed."""
    if not items:
        return None
    if kind == "chat":
        return _chat_shape(items, caller, opens)
    return _shape(kind, items, caller, opens)


def _chat_shape(items: list[Any], caller: str, opens: bool) -> Shape | None:
    """`_shape` of a chat history, in fewer steps when it opens a run or its last answer made one tool call
    (an agent's round): the same prints."""
    try:
        roles = list(map(_role, items))
    except (KeyError, TypeError):
        return _shape("chat", items, caller, opens)
    n = len(items)
    if "assistant" not in roles:
        if not opens:
            return None
        try:
            task = _xx(_dumps(items[-1]))
        except TypeError:
            return None
        return None, (n, _xx(b"%s\x00%d" % (caller.encode("utf-8", "replace"), task))), None, 0
    last = n - 1 - roles[::-1].index("assistant")
    calls = items[last].get("tool_calls")
    if type(calls) is not list or len(calls) != 1 or type(call := calls[0]) is not dict:
        return _shape("chat", items, caller, opens)
    call_id, function = call.get("id"), call.get("function")
    name = function.get("name") if type(function) is dict else None
    if type(call_id) is not str or type(name) is not str:
        return _shape("chat", items, caller, opens)  # (a parallel call, an odd one)
    first = roles.index("assistant")
    try:
        task = _xx(_dumps(items[first - 1] if first else items[0]))
        same = _xx(_dumps([function]))
    except TypeError:
        return None
    base = b"%s\x00%d" % (caller.encode("utf-8", "replace"), task)
    sig = call_id.encode()
    if last > first:
        prev = last - 1 - roles[last - 1::-1].index("assistant")
        before, called = _chat_sig(items[prev])
        anchor = before if called else _anchor("chat", items, roles, prev - 1)
        after = _xx(b"%s%s\x01%s" % (base, before, anchor))
    else:
        after = _xx(base)
    return (last, after), (n, _xx(b"%s%s\x01%s" % (base, sig, sig))), (name,), same


def _shape(kind: str, items: list[Any], caller: str, opens: bool) -> Shape | None:
    """`shape`, read the general way: any family, any history."""
    n = len(items)
    if kind == "responses":
        starts = [i for i in range(n) if _is_output(items[i]) and (i == 0 or not _is_output(items[i - 1]))]
        if not starts and not opens:
            return None
        first = starts[0] if starts else n
        last = starts[-1] if starts else -1
        prev = starts[-2] if len(starts) > 1 else -1
    else:
        roles = _roles(items)
        if "assistant" not in roles:
            if not opens:
                return None
            first = n
            last = prev = -1
        else:
            first = roles.index("assistant")
            last = n - 1 - roles[::-1].index("assistant")
            prev = last - 1 - roles[last - 1::-1].index("assistant") if last > first else -1
    task = items[first - 1] if first > 0 else items[0]
    try:
        base = b"%s\x00%d" % (caller.encode("utf-8", "replace"), _xx(_dumps(task)))
    except TypeError:
        return None
    if last < 0:
        return None, (n, _xx(base)), None, 0
    if kind == "responses":
        def group(start: int) -> list[Any]:
            end = start
            while end < n and _is_output(items[end]):
                end += 1
            return items[start:end]
        sig, (names, same) = _responses_answer(group(last), True)
        before = _responses_answer(group(prev), False)[0] if prev >= 0 else None
        own_anchor = before_anchor = b""
    else:
        sig, (names, same) = (_chat_answer if kind == "chat" else _anthropic_answer)(items[last], True)
        own_anchor = sig if names else _anchor(kind, items, roles, last - 1)
        before, before_anchor = None, b""
        if prev >= 0:
            before, called = (_chat_sig if kind == "chat" else _anthropic_sig)(items[prev])
            before_anchor = before if called else _anchor(kind, items, roles, prev - 1)
    after = _xx(base) if before is None else _xx(b"%s%s\x01%s" % (base, before, before_anchor))
    return (last, after), (n, _xx(b"%s%s\x01%s" % (base, sig, own_anchor))), names, same
