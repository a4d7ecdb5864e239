"""What a request's history says about its run: its link to the request it continues, read without hashing
the history.

An agent resends its whole history every round: the request after request E holds E's items, then E's
answer (the model's turn: an assistant message, or the Responses API's output items), then what the agent
adds (tool results, the user's next words). A model's turn is unique to its round (its tool calls' ids are
DeepSeek's, one per call), so a request's print is its length and its last answer's signature: the request
whose last answer starts at position p continues the request whose print is (p, the answer before). A run's
first two requests have no answer before, and are linked by their task (the item before the first answer)
instead. Reading a round costs the same however long the history is: the roles (in C) and two answers.

The prints are short strings, kept with each request's usage record (`Link`): runs are put together from
them when they are read (chatgate/runs/assemble.py), and the tracker (chatgate/runs/tracker.py) follows them
in memory for the runs it bounds.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import orjson
import xxhash

_xx = xxhash.xxh3_64_intdigest
_dumps = orjson.dumps
_role = operator.itemgetter("role")
OUTPUT_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call", "reasoning",
                          "web_search_call", "file_search_call", "computer_call", "mcp_call",
                          "image_generation_call"})
ANCHOR_SCAN = 64  # items looked back through for the last answer that called tools

Sig = str | int
Print = tuple[int, Sig]
Link = tuple[Print | None, Print, tuple[str, ...] | None]
"""A request's history as runs read it, `(after, own, names)`: the print of the request it continues (None:
it continues none; it opens a run), its own print, and the names of the tool calls of the answer it carries
back (the last one: None when it carries none, () when that answer called no tool). A print is
`(position, signature)`; a signature is an answer's tool call ids, else `"t<hash of its text>@<anchor>"`
(the ids of the last answer before it that called tools, else the task), or the hash of the task (an int)
where no answer comes before. Plain tuples, strings and ints: one is made for every request read, and kept
in its usage record as JSON as it is."""


def _text(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", "replace")
    return _dumps(content) if content is not None else b""


def _task(item: Any) -> int | None:
    if type(item) is dict and type(content := item.get("content")) is str:  # (a chat message's words)
        return _xx(content.encode("utf-8", "replace"))
    try:
        return _xx(_dumps(item))
    except TypeError:
        return None


def _name(value: Any) -> str:
    return value if isinstance(value, str) else "?"


# --- the families' answers: (their tool call ids, None when they called none; their text) -----------------


def _chat_ids(item: Any) -> str | None:
    calls = item.get("tool_calls") if type(item) is dict else None
    if type(calls) is not list or not calls:
        return None
    if len(calls) == 1 and type(call := calls[0]) is dict and type(one := call.get("id")) is str:
        return one
    try:
        return ",".join([call["id"] for call in calls])
    except (KeyError, TypeError):
        pass
    try:
        return ",".join([str(call["id"]) for call in calls])
    except (KeyError, TypeError):
        return f"h{_xx(_dumps(calls)):x}"


def _chat_names(item: dict[str, Any]) -> tuple[str, ...]:
    names = []
    for call in item["tool_calls"]:
        function = call.get("function") if type(call) is dict else None
        names.append(_name(function.get("name") if type(function) is dict else None))
    return tuple(names)


def _chat_text(item: Any) -> bytes:
    return _text(item.get("content")) if type(item) is dict else b""


def _uses(item: Any) -> list[dict[str, Any]]:
    content = item.get("content") if type(item) is dict else None
    if type(content) is not list:
        return []
    return [b for b in content if type(b) is dict and b.get("type") in ("tool_use", "server_tool_use")]


def _anthropic_ids(item: Any) -> str | None:
    uses = _uses(item)
    return ",".join([str(b.get("id")) for b in uses]) if uses else None


def _anthropic_text(item: Any) -> bytes:
    content = item.get("content") if type(item) is dict else None
    if type(content) is not list:
        return _text(content)
    return b"\x00".join([_text(b.get("text")) for b in content
                          if type(b) is dict and b.get("type") == "text"])


def _roles(items: list[Any]) -> list[Any]:
    try:
        return list(map(_role, items))
    except (KeyError, TypeError):
        return [i.get("role") if type(i) is dict else None for i in items]


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


def link(kind: str, items: list[Any], opens: bool) -> Link | None:
    """The request's `Link`. None: no items, or no answer in them and it does not open a run (`opens`: it
    offers tools, as an agent's first request does; a plain chat's first request is left alone)."""
    if not items:
        return None
    if kind == "responses":
        return _responses_link(items, opens)
    return _link(kind, _roles(items), items, opens)


def answered_link(items: list[Any], answers: Sequence[tuple[int, Any]], opens: bool) -> Link | None:
    """`link` of a chat history whose answers (its assistant messages, by position) the rules have found
    already (`Verdict.answers`): in fewer steps where its last answer made one tool call (an agent's round),
    else read the general way. The same prints."""
    if not answers:
        return _opening(items, opens)
    last, answer = answers[-1]
    calls = answer.get("tool_calls")
    if type(calls) is not list or len(calls) != 1 or type(call := calls[0]) is not dict:
        return _link("chat", _roles(items), items, opens)
    call_id, function = call.get("id"), call.get("function")
    name = function.get("name") if type(function) is dict else None
    if type(call_id) is not str or type(name) is not str:
        return _link("chat", _roles(items), items, opens)
    before: Sig | None
    if len(answers) == 1:
        before = _task(items[last - 1] if last else items[0])
        if before is None:
            return None
    else:
        before = _chat_ids(answers[-2][1])
        if before is None:  # a text answer: its signature's anchor is read the general way
            return _link("chat", _roles(items), items, opens)
    return (last, before), (len(items), call_id), (name,)


def _opening(items: list[Any], opens: bool) -> Link | None:
    """The link of a history with no answer in it: it opens a run (when `opens`) at its task's print."""
    if not opens:
        return None
    task = _task(items[-1])
    return None if task is None else (None, (len(items), task), None)


def _link(kind: str, roles: list[Any], items: list[Any], opens: bool) -> Link | None:
    """`link` of a chat or Anthropic history, read the general way."""
    n = len(items)
    if "assistant" not in roles:
        return _opening(items, opens)
    ids, text = (_chat_ids, _chat_text) if kind == "chat" else (_anthropic_ids, _anthropic_text)
    first = roles.index("assistant")
    last = n - 1 - roles[::-1].index("assistant")
    answer = items[last]
    sig = ids(answer)
    names: tuple[str, ...] = ()
    if sig is None:
        sig = _text_sig(ids, text, items, roles, last, first)
    elif kind == "chat":
        names = _chat_names(answer)
    else:
        names = tuple(_name(b.get("name")) for b in _uses(answer))
    before: Sig | None
    if last == first:
        before = _task(items[first - 1] if first else items[0])
        if before is None:
            return None
    else:
        prev = last - 1 - roles[last - 1::-1].index("assistant")
        before = ids(items[prev]) or _text_sig(ids, text, items, roles, prev, first)
    return (last, before), (n, sig), names


def _text_sig(ids: Any, text: Any, items: list[Any], roles: list[Any], at: int, first: int) -> str:
    """The signature of an answer that called no tool: its text's hash, anchored to the last answer before
    it that called tools (two runs may answer in the same words), else to the task."""
    anchor = None
    for j in range(at - 1, max(at - 1 - ANCHOR_SCAN, -1), -1):
        if roles[j] == "assistant" and (anchor := ids(items[j])) is not None:
            break
    if anchor is None:
        anchor = _task(items[first - 1] if first else items[0])
    return f"t{_xx(text(items[at])):x}@{anchor}"


# --- the Responses API: an answer is a group of output items ---------------------------------------------


def _is_output(item: Any) -> bool:
    return type(item) is dict and (item.get("type") in OUTPUT_TYPES or item.get("role") == "assistant")


def _group_sig(group: list[Any], task: int) -> tuple[str, tuple[str, ...]]:
    calls = [i for i in group if i.get("call_id") is not None]
    if not calls:
        texts = b"\x00".join([_text(i.get("content")) for i in group if i.get("role") == "assistant"])
        return f"t{_xx(texts):x}@{task}", ()
    names = tuple(_name(i.get("name") or i.get("type")) for i in calls)
    return ",".join([str(i.get("call_id")) for i in calls]), names


def _starts(items: list[Any]) -> list[int]:
    """Where each answer (a run of output items) begins."""
    return [i for i in range(len(items))
            if _is_output(items[i]) and (i == 0 or not _is_output(items[i - 1]))]


def _group(items: list[Any], start: int) -> list[Any]:
    end = start
    while end < len(items) and _is_output(items[end]):
        end += 1
    return items[start:end]


def _responses_link(items: list[Any], opens: bool) -> Link | None:
    n = len(items)
    starts = _starts(items)
    if not starts:
        return _opening(items, opens)
    first = starts[0]
    task = _task(items[first - 1] if first else items[0])
    if task is None:
        return None
    last = starts[-1]
    sig, names = _group_sig(_group(items, last), task)
    before = _group_sig(_group(items, starts[-2]), task)[0] if len(starts) > 1 else task
    return (last, before), (n, sig), names


# --- the same tool call in a row (a bounded run's repeats) -----------------------------------------


def calls_hash(kind: str, items: list[Any]) -> int:
    """One hash of the tool calls (names and arguments) of the last answer in `items`: equal for the same
    calls with the same arguments; 0 when it called none. Read only for a run with bounds."""
    try:
        if kind == "responses":
            starts = _starts(items)
            group = [i for i in _group(items, starts[-1]) if i.get("call_id") is not None] if starts else []
            if not group:
                return 0
            return _xx(_dumps([[i.get("name"), i.get("arguments", i.get("input", i.get("action")))]
                               for i in group]))
        roles = _roles(items)
        if "assistant" not in roles:
            return 0
        answer = items[len(items) - 1 - roles[::-1].index("assistant")]
        if kind == "chat":
            calls = answer.get("tool_calls") if type(answer) is dict else None
            if type(calls) is not list or not calls:
                return 0
            return _xx(_dumps([c.get("function") if type(c) is dict else c for c in calls]))
        uses = _uses(answer)
        return _xx(_dumps([[b.get("name"), b.get("input")] for b in uses])) if uses else 0
    except TypeError:
        return 0
