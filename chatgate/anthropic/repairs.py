"""The Anthropic route's repairs (chatgate/repair/base.py CATALOG) as pure functions over the parsed request.

Each fixes only the problems it names, where the result is certainly valid; the gateway checks the result
again. `recalled` holds the thinking blocks chatgate remembers for the turns of A10 problems (message index
-> JSON array of blocks); where it remembers nothing, restore_thinking puts in the empty thinking block
DeepSeek accepts (docs/rules-anthropic.md, A10: live-tested).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from chatgate.errors import Problem
from chatgate.repair.base import Applied, RepairOptions

_MESSAGE = re.compile(r"^messages\[(\d+)\]")
_BLOCK = re.compile(r"^messages\[(\d+)\]\.content\[(\d+)\]")
_USER_ID_BAD = re.compile(r"[^a-zA-Z0-9_-]")
EMPTY_THINKING: dict[str, Any] = {"type": "thinking", "thinking": ""}

HANDLES: dict[str, frozenset[str]] = {
    "restore_thinking": frozenset({"thinking_block_missing"}),
    "thinking_conflict": frozenset({"thinking_disabled_with_effort"}),
    "system_messages": frozenset({"invalid_role"}),
    "split_tool_results": frozenset({"tool_use_unanswered"}),
    "empty_assistant": frozenset({"empty_content"}),
    "forced_tool_choice": frozenset({"tool_choice_in_thinking"}),
    "user_id": frozenset({"invalid_user_id"}),
    "model_suffix": frozenset({"model_suffix"}),
    "redacted_thinking": frozenset({"unsupported_block"}),
}


def wanted(found: Sequence[Problem], options: RepairOptions) -> bool:
    return any(p.code in HANDLES[name] for p in found for name in options.enabled if name in HANDLES)


def message_index(problem: Problem) -> int | None:
    match = _MESSAGE.match(problem.param or "")
    return int(match.group(1)) if match else None


def tool_calls_of(message: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ids, names) of an assistant message's tool_use and server_tool_use blocks."""
    blocks = [b for b in _list(message) if b.get("type") in ("tool_use", "server_tool_use")]
    return tuple(str(b.get("id", "")) for b in blocks), tuple(str(b.get("name", "")) for b in blocks)


def thinking_wanted(data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                    ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The assistant turns restore_thinking would fix, with their tool calls (the memory's key)."""
    if not options.on("restore_thinking"):
        return {}
    messages = data.get("messages") or []
    out = {}
    for p in found:
        i = message_index(p)
        if p.code == "thinking_block_missing" and i is not None and i < len(messages):
            out[i] = tool_calls_of(messages[i])
    return out


def repair_messages(data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
                    recalled: Mapping[int, str]) -> list[Applied]:
    """Apply the enabled repairs to `data` in place; what was applied, with the request's own indices."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return []
    codes = {p.code for p in found}
    applied: list[Applied] = []

    def on(name: str) -> bool:
        return options.on(name) and bool(HANDLES[name] & codes)

    def each(code: str) -> list[Problem]:
        return [p for p in found if p.code == code]

    if on("restore_thinking"):
        for p in each("thinking_block_missing"):
            i = message_index(p)
            msg = _message(messages, i)
            if i is None or msg is None or msg.get("role") != "assistant":
                continue
            if not isinstance(msg.get("content"), list):
                continue
            blocks, how = _remembered(recalled.get(i))
            msg["content"][:0] = blocks
            applied.append(Applied("restore_thinking", f"messages[{i}]", how))
    if on("thinking_conflict") and isinstance(data.get("output_config"), dict):
        effort = data["output_config"].pop("effort", None)
        if not data["output_config"]:
            del data["output_config"]
        applied.append(Applied("thinking_conflict", "output_config.effort", f"dropped {effort!r}"))
    if on("empty_assistant"):
        for p in each("empty_content"):
            i = message_index(p)
            msg = _message(messages, i)
            if msg is not None and msg.get("role") == "assistant" and msg.get("content") == []:
                msg["content"] = [{"type": "text", "text": " "}]
                applied.append(Applied("empty_assistant", f"messages[{i}].content"))
    if on("forced_tool_choice"):
        data["thinking"] = {"type": "disabled"}
        if isinstance(data.get("output_config"), dict):
            data["output_config"].pop("effort", None)
            if not data["output_config"]:
                del data["output_config"]
        applied.append(Applied("forced_tool_choice", "thinking", "thinking disabled for this request"))
    metadata = data.get("metadata")
    if on("user_id") and isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        cleaned = _USER_ID_BAD.sub("_", data["metadata"]["user_id"])[:512]
        if cleaned:
            data["metadata"]["user_id"] = cleaned
            applied.append(Applied("user_id", "metadata.user_id"))
    if on("model_suffix") and isinstance(data.get("model"), str) and data["model"].endswith("[1m]"):
        data["model"] = data["model"].removesuffix("[1m]")
        applied.append(Applied("model_suffix", "model", f"now {data['model']!r}"))
    if on("redacted_thinking"):
        applied += _drop_redacted(messages, found)
    if on("split_tool_results"):
        applied += _merge_tool_results(messages, found)
    if on("system_messages"):
        applied += _merge_system(data, messages, found)
    return applied


def _remembered(payload: str | None) -> tuple[list[Any], str]:
    if payload:
        try:
            blocks = orjson.loads(payload)
        except orjson.JSONDecodeError:
            blocks = None
        if isinstance(blocks, list) and blocks and all(isinstance(b, dict) for b in blocks):
            return blocks, "the thinking chatgate relayed"
    return [dict(EMPTY_THINKING)], "an empty thinking block (chatgate did not relay this turn)"


def _drop_redacted(messages: list[Any], found: Sequence[Problem]) -> list[Applied]:
    where: dict[int, list[int]] = {}
    for p in found:
        match = _BLOCK.match(p.param or "")
        if p.code != "unsupported_block" or not match:
            continue
        i, j = int(match.group(1)), int(match.group(2))
        content = (_message(messages, i) or {}).get("content")
        if isinstance(content, list) and j < len(content) and content[j].get("type") == "redacted_thinking":
            where.setdefault(i, []).append(j)
    applied = []
    for i, blocks in where.items():
        content = messages[i]["content"]
        if len(blocks) == len(content):
            continue  # dropping them all would leave an empty message (A6): not certain to be valid
        for j in sorted(blocks, reverse=True):
            del content[j]
        applied += [Applied("redacted_thinking", f"messages[{i}].content[{j}]") for j in sorted(blocks)]
    return applied


def _merge_tool_results(messages: list[Any], found: Sequence[Problem]) -> list[Applied]:
    """A7: the tool_result blocks of assistant i's calls, found in later messages, move into message i + 1
    (which is made a user message if need be); messages left empty are dropped. Only where every missing
    id is found."""
    applied = []
    emptied: set[int] = set()
    for p in found:
        i = message_index(p)
        msg = _message(messages, i)
        if p.code != "tool_use_unanswered" or i is None or msg is None or i + 1 >= len(messages):
            continue
        ids, _ = tool_calls_of(msg)
        ids = tuple(x for x, b in zip(ids, _tool_use_kinds(msg), strict=True) if b == "tool_use")
        at = i + 1  # the message after the calls (a latest_reminder before it stays before it)
        while at + 1 < len(messages) and isinstance(messages[at], dict) \
                and messages[at].get("role") == "latest_reminder":
            at += 1
        nxt = messages[at]
        present = {b.get("tool_use_id") for b in _list(nxt)} if nxt.get("role") == "user" else set()
        missing = [x for x in ids if x not in present]
        moves: list[tuple[int, int]] = []
        for k in range(at + 1, len(messages)):
            if messages[k].get("role") != "user":
                continue
            for j, block in enumerate(_list(messages[k])):
                if block.get("type") == "tool_result" and block.get("tool_use_id") in missing:
                    moves.append((k, j))
        if {_list(messages[k])[j].get("tool_use_id") for k, j in moves} != set(missing) or not missing:
            continue
        moved = [_list(messages[k])[j] for k, j in moves]
        for k, j in sorted(moves, reverse=True):
            del messages[k]["content"][j]
            if not messages[k]["content"]:
                emptied.add(k)
        if nxt.get("role") == "user":
            content = nxt["content"] if isinstance(nxt["content"], list) else \
                [{"type": "text", "text": nxt["content"]}]
            nxt["content"] = [*(b for b in content if b.get("type") == "tool_result"), *moved,
                              *(b for b in content if b.get("type") != "tool_result")]
        else:
            at = at if nxt.get("role") != "latest_reminder" else at + 1
            messages.insert(at, {"role": "user", "content": moved})
            emptied = {k + 1 for k in emptied}
        applied.append(Applied("split_tool_results", f"messages[{i}].content",
                               "moved " + ", ".join(str(b.get("tool_use_id")) for b in moved)))
    for k in sorted(emptied, reverse=True):
        del messages[k]
    return applied


def _merge_system(data: dict[str, Any], messages: list[Any], found: Sequence[Problem]) -> list[Applied]:
    """A3: `system` messages inside `messages` (Claude Code's environment and reminder turns) are appended to
    the top-level system as its last text blocks, in their order, each block as it was sent; a string system
    becomes its one text block first. A system message that only states a per-turn `output_config` (Claude
    Code's `{"role": "system", "content": [], "output_config": …}`) sets the request's `output_config` (the
    last such statement is the one in force for the turn being generated). Only messages whose content is
    text (a string or text blocks) are moved; anything else stays for A3 to refuse."""
    picked: list[tuple[int, list[dict[str, Any]], Any]] = []
    for p in found:
        i = message_index(p)
        msg = _message(messages, i)
        if p.code == "invalid_role" and i is not None and msg is not None and msg.get("role") == "system":
            blocks = _system_blocks(msg.get("content"))
            statement = msg.get("output_config")
            if blocks is not None and (blocks or isinstance(statement, dict)):
                picked.append((i, blocks, statement))
    if not picked:
        return []
    picked.sort(key=lambda entry: entry[0])
    added = [block for _, blocks, _ in picked for block in blocks]
    system = data.get("system")
    if added:
        if system is None or system == "":
            data["system"] = added
        elif isinstance(system, str):
            data["system"] = [{"type": "text", "text": system}, *added]
        elif isinstance(system, list):
            system.extend(added)
        else:
            return []
    applied = []
    for i, blocks, statement in picked:
        detail = f"{len(blocks)} text block(s) appended to system" if blocks else ""
        if isinstance(statement, dict):
            config = data.get("output_config")
            data["output_config"] = {**(config if isinstance(config, dict) else {}), **statement}
            detail = ", ".join(filter(None, [detail, f"output_config {orjson.dumps(statement).decode()} "
                                                      "now the request's"]))
        applied.append(Applied("system_messages", f"messages[{i}]", detail))
    for i, _, _ in reversed(picked):
        del messages[i]
    return applied


def _system_blocks(content: Any) -> list[dict[str, Any]] | None:
    """A system message's content as top-level system blocks: a string is one text block; text blocks are
    kept as sent (cache_control included); None if anything else is in it."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return [dict(b) for b in content]
    return None


def _tool_use_kinds(msg: dict[str, Any]) -> list[str]:
    return [str(b.get("type")) for b in _list(msg) if b.get("type") in ("tool_use", "server_tool_use")]


def _list(msg: Any) -> list[Any]:
    content = msg.get("content") if isinstance(msg, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _message(messages: list[Any], i: int | None) -> dict[str, Any] | None:
    if i is None or not 0 <= i < len(messages) or not isinstance(messages[i], dict):
        return None
    msg: dict[str, Any] = messages[i]
    return msg
