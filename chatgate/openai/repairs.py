"""The chat family's repairs (chatgate/repair/base.py CATALOG) as pure functions over the parsed request.

Each repair fixes only the problems it names, where the result is certainly valid; the gateway checks the
repaired request again and refuses whatever is left. `recalled` holds the reasoning chatgate remembers for
the assistant turns of R17 problems (message index -> reasoning_content), looked up by the gateway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from chatgate.errors import Problem
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, InPlace, RepairOptions, TurnCalls

_MESSAGE = re.compile(r"^messages\[(\d+)\]")
_PART = re.compile(r"^messages\[(\d+)\]\.content\[(\d+)\]$")
_USER_ID_BAD = re.compile(r"[^a-zA-Z0-9_-]")

# codes of the problems each repair fixes
HANDLES: dict[str, frozenset[str]] = {
    "restore_reasoning": frozenset({"reasoning_content_missing"}),
    "thinking_conflict": frozenset({"thinking_disabled_with_effort"}),
    "developer_role": frozenset({"invalid_role"}),
    "flatten_content": frozenset({"content_not_string"}),
    "strip_images": frozenset({"image_not_supported"}),
    "forced_tool_choice": frozenset({"tool_choice_in_thinking"}),
    "clamp_max_tokens": frozenset({"max_tokens_out_of_range"}),
    "user_id": frozenset({"invalid_user_id"}),
    "orphan_tool_messages": frozenset({"tool_without_tool_calls", "unknown_tool_call_id"}),
    "unanswered_tool_calls": frozenset({"tool_calls_unanswered"}),
}
FIXED_BY: dict[str, tuple[str, ...]] = {
    code: tuple(name for name, codes in HANDLES.items() if code in codes)
    for code in frozenset().union(*HANDLES.values())
}


def wanted(found: Sequence[Problem], options: RepairOptions) -> bool:
    """Whether any enabled repair handles any of these problems (cheap: most requests have none)."""
    return any(name in options.enabled for p in found for name in FIXED_BY.get(p.code, ()))


def reasoning_wanted(found: Sequence[Problem], options: RepairOptions) -> list[int]:
    """The indices of the assistant messages whose reasoning_content restore_reasoning would look up."""
    if not options.on("restore_reasoning"):
        return []
    return [i for p in found if p.code == "reasoning_content_missing" and (i := message_index(p)) is not None]


def message_index(problem: Problem) -> int | None:
    match = _MESSAGE.match(problem.param or "")
    return int(match.group(1)) if match else None


def repair_chat(data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
                profile: ModelProfile | None, recalled: Mapping[int, str]) -> list[Applied]:
    """Apply the enabled repairs to `data` in place; what was applied, with the request's own indices."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return []
    applied: list[Applied] = []
    codes = {p.code for p in found}
    if codes == _RESTORE_ONLY:  # the common case by far (an agent that drops reasoning): nothing else to do
        return _restore(messages, found, options, recalled)
    on = {name for code in codes for name in FIXED_BY.get(code, ()) if name in options.enabled}.__contains__

    def each(code: str) -> list[Problem]:
        return [p for p in found if p.code == code]

    if on("restore_reasoning"):
        applied += _restore(messages, each("reasoning_content_missing"), options, recalled)
    if on("thinking_conflict") and "reasoning_effort" in data:
        effort = data.pop("reasoning_effort")
        applied.append(Applied("thinking_conflict", "reasoning_effort", f"dropped {effort!r}"))
    if on("developer_role"):
        for p in each("invalid_role"):
            i = message_index(p)
            msg = _message(messages, i)
            if msg is not None and msg.get("role") == "developer":
                msg["role"] = "system"
                applied.append(Applied("developer_role", f"messages[{i}]"))
    if on("flatten_content"):
        for p in each("content_not_string"):
            i = message_index(p)
            msg = _message(messages, i)
            if msg is not None and msg.get("role") in ("system", "assistant", "tool"):
                text = _all_text(msg.get("content"))
                if text is not None:
                    msg["content"] = text
                    applied.append(Applied("flatten_content", f"messages[{i}].content"))
    if on("strip_images"):
        for p in each("image_not_supported"):
            match = _PART.match(p.param or "")
            msg = _message(messages, int(match.group(1))) if match else None
            content = msg.get("content") if msg is not None else None
            if match and isinstance(content, list) and int(match.group(2)) < len(content):
                content[int(match.group(2))] = {"type": "text", "text": options.image_placeholder}
                applied.append(Applied("strip_images", p.param or ""))
    if on("forced_tool_choice"):
        data["thinking"] = {"type": "disabled"}
        if data.get("reasoning_effort") not in (None, "none"):
            data.pop("reasoning_effort")
        applied.append(Applied("forced_tool_choice", "thinking", "thinking disabled for this request"))
    if on("clamp_max_tokens") and profile is not None:
        value = data.get("max_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > profile.max_tokens_max:
            data["max_tokens"] = profile.max_tokens_max
            applied.append(Applied("clamp_max_tokens", "max_tokens", f"{value} -> {profile.max_tokens_max}"))
    if on("user_id") and isinstance(data.get("user_id"), str):
        cleaned = _USER_ID_BAD.sub("_", data["user_id"])[:512]
        if cleaned:
            data["user_id"] = cleaned
            applied.append(Applied("user_id", "user_id"))
    applied += _restructure(messages, found, options, on)
    return applied


_RESTORE_ONLY = {"reasoning_content_missing"}


def _restore(messages: list[Any], found: Sequence[Problem], options: RepairOptions,
             recalled: Mapping[int, str]) -> list[Applied]:
    """restore_reasoning: the recalled reasoning_content into each assistant message whose turn it is."""
    applied: list[Applied] = []
    if not options.on("restore_reasoning"):
        return applied
    for p in found:
        i = message_index(p)
        msg = _message(messages, i)
        if i is not None and msg is not None and i in recalled and msg.get("role") == "assistant":
            msg["reasoning_content"] = recalled[i]
            applied.append(Applied("restore_reasoning", f"messages[{i}]"))
    return applied


_CALLS_KEY = b'"tool_calls"'
# A key may spell a letter or "_" as a \u escape (\u0074 for "t"): where the body has such an escape, the
# key's bytes cannot be found by their plain spelling.
_ESCAPED_NAME_CHAR = re.compile(rb"\\u00(?:5[fF]|[67][0-9a-fA-F])")


def reasoning_in_place(body: bytes, messages: Sequence[Any], problems: Sequence[Problem]) -> InPlace | None:
    """restore_reasoning on the body's bytes, when every problem is a dropped reasoning_content: each
    recalled one goes in front of its message's `"tool_calls"` key, and every other byte stays as the
    client sent it. None unless that place is certain: each message that has the key (as validated:
    `messages`) has it spelled plainly, once, and no other object of the body has it (the counts agree), so
    the k-th key in the bytes is the k-th of those messages'; and no message to fix has a
    reasoning_content key already (a null one would be a duplicate key)."""
    wanted: dict[int, TurnCalls] = {}
    for p in problems:  # first: a request with another problem costs no scan of its body
        i = message_index(p) if p.code == "reasoning_content_missing" else None
        if i is None or i >= len(messages):
            return None
        msg = messages[i]
        if "reasoning_content" in msg or msg.get("role") != "assistant" or "tool_calls" not in msg:
            return None
        wanted[i] = calls_of(msg)
    keyed = [i for i, msg in enumerate(messages) if "tool_calls" in msg]
    if (not wanted or body.count(_CALLS_KEY) != len(keyed)
            or (body.find(b"\\u00") >= 0 and _ESCAPED_NAME_CHAR.search(body))):
        return None
    places: dict[int, int] = {}  # message index -> where its key starts, for the messages to fix
    at, last = -1, max(wanted)
    for i in keyed:
        at = body.find(_CALLS_KEY, at + 1)
        if body[at + len(_CALLS_KEY):at + len(_CALLS_KEY) + 1] != b":":  # a value, or a space before ':'
            return None
        if i in wanted:
            places[i] = at
        if i == last:
            break

    def apply(recalled: Mapping[int, str]) -> tuple[bytes, list[Applied]]:
        pieces: list[bytes] = []
        applied: list[Applied] = []
        done = 0
        for i, at in places.items():
            if i in recalled:
                pieces += (body[done:at], b'"reasoning_content":', orjson.dumps(recalled[i]), b",")
                applied.append(Applied("restore_reasoning", f"messages[{i}]"))
                done = at
        pieces.append(body[done:])
        return b"".join(pieces), applied

    return InPlace(wanted, apply)


def calls_of(message: Any) -> TurnCalls:
    """(ids, names) of an assistant message's tool calls."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    ids: list[str] = []
    names: list[str] = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        ids.append(str(call.get("id", "")) if isinstance(call, dict) else "")
        names.append(str(function.get("name", "")) if isinstance(function, dict) else "")
    return tuple(ids), tuple(names)


def _restructure(messages: list[Any], found: Sequence[Problem], options: RepairOptions,
                 on: Callable[[str], bool]) -> list[Applied]:
    """Drop orphan tool messages and answer unanswered calls: one new list, built from the original
    indices, so both repairs (and their reported paths) refer to the request as it came."""
    drop: set[int] = set()
    if on("orphan_tool_messages"):
        for p in found:
            i = message_index(p)
            msg = _message(messages, i)
            # A warned unknown id has a tool message for each call: dropping it alone would leave too
            # few, a certain R16 where the request was forwarded; with its call answered, it goes.
            if (p.code in HANDLES["orphan_tool_messages"] and i is not None and msg is not None
                    and msg.get("role") == "tool" and (not p.warning or on("unanswered_tool_calls"))):
                drop.add(i)
    inserts: dict[int, list[dict[str, Any]]] = {}  # after this original index
    applied: list[Applied] = [Applied("orphan_tool_messages", f"messages[{i}]") for i in sorted(drop)]
    if on("unanswered_tool_calls"):
        for p in found:
            i = message_index(p)
            if p.code != "tool_calls_unanswered" or i is None:
                continue
            end, missing = _unanswered(messages, i)
            if missing:
                inserts.setdefault(end, []).extend(
                    {"role": "tool", "tool_call_id": call_id, "content": options.unanswered_tool_text}
                    for call_id in missing)
                applied.append(Applied("unanswered_tool_calls", f"messages[{i}].tool_calls",
                                       "answered " + ", ".join(missing)))
    if drop or inserts:
        rebuilt: list[Any] = []
        for k, msg in enumerate(messages):
            if k not in drop:
                rebuilt.append(msg)
            rebuilt.extend(inserts.get(k, ()))
        messages[:] = rebuilt
    return applied


def _unanswered(messages: list[Any], i: int) -> tuple[int, list[str]]:
    """(index of the last tool message right after assistant i, or i; ids of i's calls not answered there)."""
    msg = _message(messages, i)
    calls = msg.get("tool_calls") if msg is not None else None
    if not isinstance(calls, list):
        return i, []
    ids: list[str] = [c["id"] for c in calls
                      if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]
                      and "function" in c]
    end = i
    answered: set[Any] = set()
    while end + 1 < len(messages) and isinstance(messages[end + 1], dict) and \
            messages[end + 1].get("role") == "tool":
        end += 1
        answered.add(messages[end].get("tool_call_id"))
    return end, [x for x in dict.fromkeys(ids) if x not in answered]


def _message(messages: list[Any], i: int | None) -> dict[str, Any] | None:
    if i is None or not 0 <= i < len(messages) or not isinstance(messages[i], dict):
        return None
    msg: dict[str, Any] = messages[i]
    return msg


def _all_text(content: Any) -> str | None:
    """An array of text parts joined with newlines; None if any part is not text."""
    if not isinstance(content, list) or not content:
        return None
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
        return None
    return "\n".join(t for t in texts if isinstance(t, str))
