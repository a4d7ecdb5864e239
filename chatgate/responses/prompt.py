"""How the context cache sees a Responses request: its parts in the order DeepSeek renders them
(chatgate/metering/cache.py compares them between a caller's requests)."""

from __future__ import annotations

from typing import Any

from chatgate.metering.cache import (
    NO_PART,
    Parts,
    PromptShape,
    always,
    field_of,
    item_hashes,
    named_layout,
    part_hash,
    tools_hash_of,
)


def parts_responses(request: Any) -> Parts:
    """The Responses API: instructions (the first system message), tools, then the input items."""
    user = field_of(request, "user")
    hashes = [part_hash(field_of(request, "model")), part_hash(user) if user is not None else NO_PART]
    names = ["model", "user"]
    system: dict[int, bytes] = {}
    instructions = field_of(request, "instructions")
    if instructions is not None:
        system[len(names)] = part_hash(instructions)
        names.append("instructions")
        hashes.append(system[len(names) - 1])
    tools_hash = tools_hash_of(request)
    if tools_hash is not None:
        names.append("tools")
        hashes.append(tools_hash)
    items = field_of(request, "input")
    count = -1
    if isinstance(items, list):
        hashes.append(item_hashes(items))
        count = len(items)
    elif items is not None:
        names.append("input")
        hashes.append(part_hash(items))
    return Parts(b"".join(hashes), named_layout(tuple(names), "input", count >= 0), system,
                 field_of(request, "tools"), count)


RESPONSES_PROMPT = PromptShape(parts_responses, "input", always)
