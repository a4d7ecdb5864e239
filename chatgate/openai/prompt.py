"""How the context cache sees a chat-completions request: its parts in the order DeepSeek renders them
(chatgate/metering/cache.py compares them between a caller's requests)."""

from __future__ import annotations

import functools
import operator
from typing import Any

from chatgate.metering.cache import (
    NO_PART,
    Layout,
    Parts,
    PromptShape,
    field_of,
    item_hashes,
    list_of,
    part_hash,
    tools_hash_of,
)


@functools.lru_cache(maxsize=256)
def _chat_layout(systems: int, tools: bool) -> Layout:
    names = ("model", "user_id", *(f"messages[{i}]" for i in range(systems)), *(("tools",) if tools else ()))
    return Layout(names, "messages", systems, 2 + systems if tools else -1)


_role = operator.itemgetter("role")


def _roles(messages: list[Any]) -> list[Any]:
    try:
        return list(map(_role, messages))
    except (KeyError, TypeError):  # a message without a role, or not an object: the rules refuse it
        return [m.get("role") if isinstance(m, dict) else None for m in messages]


def parts_chat(request: Any) -> Parts:
    """Chat completions: the system messages (DeepSeek's template puts them first), the tools, then every
    other message in order."""
    messages = list_of(field_of(request, "messages"))
    user = field_of(request, "user_id")
    head = part_hash(field_of(request, "model")) + (part_hash(user) if user is not None else NO_PART)
    roles = _roles(messages)
    n = roles.count("system")
    tools_hash = tools_hash_of(request)
    if roles[:n] == ["system"] * n:  # the usual case: the system messages lead
        hashes = item_hashes(messages)
        system = {2 + i: part_hash(field_of(messages[i], "content")) for i in range(n)}
        if tools_hash is not None:
            hashes = hashes[:8 * n] + tools_hash + hashes[8 * n:]
        layout = _chat_layout(n, tools_hash is not None)
        return Parts(head + hashes, layout, system, field_of(request, "tools"), len(messages))
    # system messages further down: DeepSeek still renders them first (rare: spelt out part by part)
    order = [i for i, r in enumerate(roles) if r == "system"]
    system = {2 + j: part_hash(field_of(messages[i], "content")) for j, i in enumerate(order)}
    rest = [i for i, r in enumerate(roles) if r != "system"]
    names = ["model", "user_id", *(f"messages[{i}]" for i in order)]
    if tools_hash is not None:
        names.append("tools")
    hashes = item_hashes([messages[i] for i in order]) + (tools_hash if tools_hash is not None else b"")
    hashes += item_hashes([messages[i] for i in rest])
    layout = Layout(tuple(names), "messages", 0, 2 + len(order) if tools_hash is not None else -1,
                    tuple(rest), False)
    return Parts(head + hashes, layout, system, field_of(request, "tools"), len(messages))


def appendable(items: list[Any]) -> bool:
    for item in items:  # a system message is rendered first: not a part at the end
        if isinstance(item, dict) and item.get("role") == "system":
            break
    else:
        return True
    return False


CHAT_PROMPT = PromptShape(parts_chat, "messages", appendable)
