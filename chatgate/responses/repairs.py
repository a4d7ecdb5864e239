"""The Responses family's repairs (chatgate/repair/base.py CATALOG) as pure functions over the parsed request.

Each fixes only the problems it names, where the result is certainly valid; the gateway checks the result
again. All of them work on the request's own item indices and build one new `input` list, so that the paths
they report refer to the request as it came:

- responses_output_order (P10): a call's output is moved directly after its batch of calls; whatever stood
  between (a developer message, a reasoning item of a later turn) now follows the outputs. Lossless.
- responses_reasoning (P11): the reasoning item of a tool-call turn is put back from what chatgate relayed to
  the same caller (`recalled`: item index -> JSON array of reasoning items); where chatgate never saw the
  turn and the client kept a summary-only reasoning item, its summary becomes its content.
- responses_strip_encrypted (P22): OpenAI's encrypted_content (which DeepSeek ignores) is removed.
- responses_orphan_outputs (P8, P9): outputs that answer no call, or have no call_id, are dropped.
- responses_unanswered_calls (P10): a call with no output anywhere gets one with a fixed text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson

from chatgate.errors import Problem
from chatgate.repair.base import Applied, RepairOptions
from chatgate.responses.protocol import Item
from chatgate.responses.rules import CALLS, OPENAI_BLOB, Shape, item_index, kind_of, shape_of

HANDLES: dict[str, frozenset[str]] = {
    "responses_output_order": frozenset({"tool_output_not_adjacent"}),
    "responses_reasoning": frozenset({"reasoning_text_missing"}),
    "responses_strip_encrypted": frozenset({"foreign_encrypted_content"}),
    "responses_orphan_outputs": frozenset({"tool_output_without_call", "missing_call_id"}),
    "responses_unanswered_calls": frozenset({"tool_output_missing"}),
}


def wanted(found: Sequence[Problem], options: RepairOptions) -> bool:
    return any(p.code in HANDLES[name] for p in found for name in options.enabled if name in HANDLES)


def items_of(data: dict[str, Any]) -> list[Item] | None:
    value = data.get("input")
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        return None
    return cast(list[Item], value)


def turn_at(shape: Shape, i: int) -> list[int]:
    return next((turn for turn in shape.turns if i in turn), [])


def calls_of_turn(items: list[Item], turn: list[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(call ids, tool names) of a turn's calls, in order: the key of the memory of relayed turns."""
    calls = [items[i] for i in turn if kind_of(items[i]) in CALLS]
    return tuple(str(c.get("call_id", "")) for c in calls), tuple(str(c.get("name", "")) for c in calls)


def reasoning_wanted(data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                     ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The turns responses_reasoning would restore from memory, by the item index of their problem."""
    items = items_of(data)
    if not options.on("responses_reasoning") or items is None:
        return {}
    shape = shape_of(items)
    out = {}
    for p in found:
        i = item_index(p)
        if p.code == "reasoning_text_missing" and i is not None and i < len(items):
            ids, names = calls_of_turn(items, turn_at(shape, i))
            if ids and all(ids):
                out[i] = (ids, names)
    return out


def turn_of(data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
    items = items_of(data)
    i = item_index(problem)
    if items is None or i is None or i >= len(items):
        return None
    return calls_of_turn(items, turn_at(shape_of(items), i))[0]


def repair_responses(data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
                     recalled: Mapping[int, str]) -> list[Applied]:
    """Apply the enabled repairs to `data` in place; what was applied, with the request's own indices."""
    items = items_of(data)
    if items is None:
        return []
    codes = {p.code for p in found}

    def on(name: str) -> bool:
        return options.on(name) and bool(HANDLES[name] & codes)

    shape = shape_of(items)
    plan = _Plan(len(items))
    applied: list[Applied] = []
    if on("responses_strip_encrypted"):
        applied += _strip(items, shape)
    if on("responses_reasoning"):
        applied += _reasoning(items, shape, found, recalled, plan)
    if on("responses_orphan_outputs"):
        applied += _orphans(items, found, plan)
    if on("responses_output_order"):
        applied += _order(items, shape, found, plan)
    if on("responses_unanswered_calls"):
        applied += _unanswered(items, shape, found, options, plan)
    if plan.changed:
        items[:] = plan.rebuild(items)
    return applied


class _Plan:
    """Changes to `input` by original index: items inserted before or after one, items removed."""

    def __init__(self, n: int) -> None:
        self.before: dict[int, list[Any]] = {}
        self.after: dict[int, list[Any]] = {}
        self.removed: set[int] = set()
        self.n = n

    @property
    def changed(self) -> bool:
        return bool(self.before or self.after or self.removed)

    def rebuild(self, items: list[Item]) -> list[Any]:
        out: list[Any] = []
        for k, item in enumerate(items):
            out += self.before.get(k, ())
            if k not in self.removed:
                out.append(item)
            out += self.after.get(k, ())
        return out


def _each(found: Sequence[Problem], code: str, certain_only: bool = False) -> list[tuple[Problem, int]]:
    out = []
    for p in found:
        i = item_index(p)
        if p.code == code and i is not None and not (certain_only and p.warning):
            out.append((p, i))
    return out


def _strip(items: list[Item], shape: Shape) -> list[Applied]:
    applied = []
    for i in shape.kept:
        item = cast(dict[str, Any], items[i])
        blob = item.get("encrypted_content")
        if kind_of(items[i]) == "reasoning" and isinstance(blob, str) and blob.startswith(OPENAI_BLOB):
            del item["encrypted_content"]
            applied.append(Applied("responses_strip_encrypted", f"input[{i}].encrypted_content"))
    return applied


def _reasoning(items: list[Item], shape: Shape, found: Sequence[Problem], recalled: Mapping[int, str],
               plan: _Plan) -> list[Applied]:
    applied = []
    for p, i in _each(found, "reasoning_text_missing"):
        turn = turn_at(shape, i)
        if not turn:
            continue
        first_act = next((k for k in turn if kind_of(items[k]) in (*CALLS, "message")), turn[-1])
        existing = next((k for k in turn if k < first_act and kind_of(items[k]) == "reasoning"), None)
        remembered = _remembered(recalled.get(i))
        if remembered:
            if existing is not None:
                item = cast(dict[str, Any], items[existing])
                item["content"] = remembered[0]["content"]
                where = f"input[{existing}].content"
            else:
                plan.before.setdefault(turn[0], []).extend(remembered)
                where = f"input[{turn[0]}]"
            applied.append(Applied("responses_reasoning", where, "the reasoning chatgate relayed"))
        elif existing is not None and not p.warning and (text := _summary_text(items[existing])):
            item = cast(dict[str, Any], items[existing])
            item["content"] = [{"type": "reasoning_text", "text": text}]
            applied.append(Applied("responses_reasoning", f"input[{existing}].content",
                                   "its summary (chatgate did not relay this turn)"))
    return applied


def _remembered(payload: str | None) -> list[dict[str, Any]]:
    """The reasoning items chatgate remembers for a turn, if they carry the content DeepSeek wants."""
    if not payload:
        return []
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(value, list) or not value:
        return []
    good = [v for v in value if isinstance(v, dict) and v.get("type") == "reasoning"
            and isinstance(v.get("content"), list) and any(
                isinstance(c, dict) and isinstance(c.get("text"), str) and c["text"] for c in v["content"])]
    return good if len(good) == len(value) else []


def _summary_text(item: Item) -> str:
    summary = item.get("summary")
    parts = [s.get("text") for s in summary if isinstance(s, dict)] if isinstance(summary, list) else []
    return "\n\n".join(t for t in parts if isinstance(t, str) and t)


def _orphans(items: list[Item], found: Sequence[Problem], plan: _Plan) -> list[Applied]:
    drop: dict[int, str] = {}
    for code, why in (("missing_call_id", "no call_id"), ("tool_output_without_call", "answers no call")):
        for _, i in _each(found, code):
            if i < len(items) and kind_of(items[i]) in ("function_call_output", "custom_tool_call_output"):
                drop.setdefault(i, why)
    plan.removed.update(drop)
    return [Applied("responses_orphan_outputs", f"input[{i}]", drop[i]) for i in sorted(drop)]


def _batch_end(shape: Shape, i: int) -> int | None:
    """The last item of the batch of calls holding input[i] and of the outputs directly after it."""
    batch = next((b for b in shape.batches if i in b), None)
    if batch is None:
        return None
    run = shape.runs[batch[0]]
    return run[-1] if run else batch[-1]


def _order(items: list[Item], shape: Shape, found: Sequence[Problem], plan: _Plan) -> list[Applied]:
    applied = []
    for _, i in sorted(_each(found, "tool_output_not_adjacent", certain_only=True), key=lambda x: x[1]):
        end = _batch_end(shape, i)
        call_id = items[i].get("call_id")
        outputs = shape.outputs.get(call_id, []) if isinstance(call_id, str) else []
        if end is None or not outputs or outputs[0] in plan.removed:
            continue
        j = outputs[0]
        plan.removed.add(j)
        plan.after.setdefault(end, []).append(items[j])
        applied.append(Applied("responses_output_order", f"input[{j}]", f"moved after input[{end}]"))
    return applied


def _unanswered(items: list[Item], shape: Shape, found: Sequence[Problem], options: RepairOptions,
                plan: _Plan) -> list[Applied]:
    applied = []
    for _, i in sorted(_each(found, "tool_output_missing"), key=lambda x: x[1]):
        end = _batch_end(shape, i)
        call_id = items[i].get("call_id")
        if end is None or not isinstance(call_id, str) or not call_id:
            continue
        custom = kind_of(items[i]) == "custom_tool_call"
        kind = "custom_tool_call_output" if custom else "function_call_output"
        plan.after.setdefault(end, []).append(
            {"type": kind, "call_id": call_id, "output": options.unanswered_tool_text})
        applied.append(Applied("responses_unanswered_calls", f"input[{i}]", f"answered {call_id}"))
    return applied
