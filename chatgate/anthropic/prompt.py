"""How the context cache sees an Anthropic Messages request: its parts in the order DeepSeek renders them
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
    list_of,
    named_layout,
    part_hash,
    tools_hash_of,
)


def parts_anthropic(request: Any) -> Parts:
    """The Anthropic route: tools, system, then the messages (the order DeepSeek renders them in)."""
    metadata = field_of(request, "metadata")
    user = field_of(metadata, "user_id") if metadata is not None else None
    hashes = [part_hash(field_of(request, "model")), part_hash(user) if user is not None else NO_PART]
    names = ["model", "metadata.user_id"]
    tools_hash = tools_hash_of(request)
    if tools_hash is not None:
        names.append("tools")
        hashes.append(tools_hash)
    system: dict[int, bytes] = {}
    prompt = field_of(request, "system")
    if prompt is not None:
        system[len(names)] = part_hash(prompt)
        names.append("system")
        hashes.append(system[len(names) - 1])
    messages = list_of(field_of(request, "messages"))
    hashes.append(item_hashes(messages))
    return Parts(b"".join(hashes), named_layout(tuple(names), "messages"), system, field_of(request, "tools"),
                 len(messages))


MESSAGES_PROMPT = PromptShape(parts_anthropic, "messages", always)
