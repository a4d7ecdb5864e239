"""Request rules of DeepSeek's native Responses API (docs/rules-responses.md, P1-P23) as pure functions.

What DeepSeek documents or was seen refusing is enforced (a 400 in the OpenAI shape, DeepSeek's words where
they are known); what it leaves uncertain is a warning (forwarded, `x-chatgate-warning`) and refused only in
strict mode: a false alarm breaks Codex, a miss only costs DeepSeek's own 400. What DeepSeek silently ignores
(previous_response_id, include, store, unknown item types, …) is never refused, at most warned about.
`param` paths use chatgate's style (`input[7].call_id`, `tools[2].name`).

How DeepSeek reads `input` (docs/rules-responses.md): items of types it does not know are dropped; consecutive
assistant-side items (reasoning, assistant message, function_call) form one assistant turn; each batch of
calls must be followed directly by the outputs of all its calls (P10), and in thinking mode with tools every
turn that calls a function needs a reasoning item with non-empty `content` before it (P11).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.profiles import ModelProfile, generic_profile
from chatgate.responses.protocol import ITEM_TYPES, ROLES, Item, ResponsesRequest
from chatgate.responses.type_errors import problems_from_validation_error
from chatgate.rules.kernel import Ordering, Rule, RuleContext, checked_beside_type_errors, in_range, run_rules
from chatgate.rules.models import Policy, unknown_model
from chatgate.surface import (
    SAFETY_LEVELS,
    SERVER_TOOLS,
    USER_ID_MAX_BYTES,
    safety_level_message,
    server_tool_model_note,
    user_id_too_long,
)
from chatgate.verdict import Verdict
from chatgate.wire import validate_body

CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")
OPENAI_BLOB = "gAAAAA"  # OpenAI's encrypted_content (a Fernet token); DeepSeek's look like d8b79690-…-0


@dataclass(slots=True)
class Shape:
    """One pass over `input`: what the sequence rules and the repairs need, by original item index."""

    items: list[Item]
    kinds: list[str]  # each item's type ("message" for an easy message without one)
    kept: list[int]  # the items DeepSeek reads (unknown types dropped), in order
    sequence: list[int] = field(default_factory=list)  # kept, less the outputs that answer no call
    calls: dict[str, list[int]] = field(default_factory=dict)  # call_id -> indices of calls with it
    outputs: dict[str, list[int]] = field(default_factory=dict)  # call_id -> indices of outputs with it
    turns: list[list[int]] = field(default_factory=list)  # runs of assistant-side items (indices)
    batches: list[list[int]] = field(default_factory=list)  # runs of call items
    runs: dict[int, list[int]] = field(default_factory=dict)  # batch's first index -> the outputs after it


def kind_of(item: Item) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message"


ASSISTANT_SIDE = ("reasoning", "web_search_call", *CALLS)


def shape_of(items: list[Item]) -> Shape:
    kinds = [kind_of(item) for item in items]
    shape = Shape(items, kinds, [i for i, kind in enumerate(kinds) if kind in ITEM_TYPES])
    for i in shape.kept:
        kind = kinds[i]
        call_id = items[i].get("call_id")
        if kind in CALLS and isinstance(call_id, str):
            shape.calls.setdefault(call_id, []).append(i)
        elif kind in OUTPUTS and isinstance(call_id, str):
            shape.outputs.setdefault(call_id, []).append(i)
    # The turns and batches are read as if the outputs P8/P9 refuse (no call_id, no call) were not there:
    # they are refused (or dropped by a repair) anyway, and must not split a batch of calls in two.
    shape.sequence = [i for i in shape.kept if kinds[i] not in OUTPUTS
                      or items[i].get("call_id") in shape.calls]
    turn: list[int] = []
    batch: list[int] = []
    for n, i in enumerate(shape.sequence):
        item = items[i]
        kind = kinds[i]
        if kind in ASSISTANT_SIDE or (kind == "message" and item.get("role") == "assistant"):
            turn.append(i)
        elif turn:
            shape.turns.append(turn)
            turn = []
        if kind in CALLS:
            batch.append(i)
            continue
        if batch:
            shape.batches.append(batch)
            run = []
            for j in shape.sequence[n:]:
                if kinds[j] not in OUTPUTS:
                    break
                run.append(j)
            shape.runs[batch[0]] = run
            batch = []
    if turn:
        shape.turns.append(turn)
    if batch:
        shape.batches.append(batch)
        shape.runs[batch[0]] = []
    return shape


@dataclass(slots=True)
class ResponsesContext(RuleContext):
    request: ResponsesRequest
    thinking: bool  # the request runs in thinking mode, as far as chatgate can tell
    sure: bool  # …and nothing in the body (a chat-style `thinking` switch) makes that uncertain
    shape: Shape
    policy: Policy


def is_thinking(req: ResponsesRequest, profile: ModelProfile, known: bool) -> bool:
    """Thinking is on by default; `reasoning.effort = "none"` turns it off (docs/rules-responses.md). Unknown
    models: unknown."""
    if not known or profile.non_thinking_only:
        return False
    return not (req.reasoning is not None and req.reasoning.effort == "none")


def check_body(body: bytes, policy: Policy, parse: object = None) -> Verdict:
    """Parse and check a Responses request body (`parse`: R1's, chatgate/wire.py `validate_body`); never
    raises."""
    try:
        request = validate_body(ResponsesRequest, body, parse)
    except pydantic.ValidationError as exc:
        found = problems_from_validation_error(exc)
        return checked_beside_type_errors(found, exc, body, ("model", "input"), ResponsesRequest,
                                          lambda rest: check_request(rest, policy))
    return check_request(request, policy)


def check_request(request: ResponsesRequest, policy: Policy) -> Verdict:
    configured = policy.profiles.get(request.model)
    # deepseek-chat / deepseek-reasoner were retired (2026-07-24) before /responses existed (2026-07-31).
    known = configured is not None and not (configured.non_thinking_only or configured.thinking_only)
    profile = configured if configured is not None and known else generic_profile(request.model)
    thinking = is_thinking(request, profile, known)
    items = request.input if isinstance(request.input, list) else []
    ctx = ResponsesContext(profile, known, policy.options, request, thinking,
                           thinking and request.thinking is None, shape_of(items), policy)
    problems, warnings = run_rules(RULES, request, ctx, ORDERING)
    client_tools = any(t["type"] in ("function", "custom") for t in request.tools or ())
    return Verdict(problems, warnings, request.model, request.stream is True, thinking, client_tools,
                   request.max_output_tokens, profile, request=request)


_ITEM = re.compile(r"^input\[(\d+)\]")


def item_index(problem: Problem) -> int | None:
    match = _ITEM.match(problem.param or "")
    return int(match.group(1)) if match else None


ORDERING = Ordering("input")


def where(i: int, item: Item) -> str:
    kind = kind_of(item)
    if kind == "message":
        return f"input[{i}] (message, role {item.get('role')})"
    call_id = item.get("call_id")
    return f"input[{i}] ({kind}" + (f" {call_id!r})" if isinstance(call_id, str) and call_id else ")")


# --- the model and the input (P2, P3) ----------------------------------------------------------------


def rule_model(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    """P2: deepseek-chat / deepseek-reasoner were retired before /responses existed: not served here."""
    if ctx.known or req.model in ctx.policy.extra_models:
        return
    served = [name for name in ctx.policy.suggestions() if name != "deepseek-v4-flash-vision-exp"]
    yield unknown_model(req.model, "responses", "P2", served, ctx.options,
                        f"The supported API model names are deepseek-flash, deepseek-v4-pro, but you passed "
                        f"{req.model}.", doubt=req.model in ctx.policy.profiles)


def rule_input(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    value = ctx.request.input
    if value is None:
        yield Problem("missing_input", "input",
                      "'input' is missing. DeepSeek is stateless: send the whole conversation in 'input' (a "
                      "string or an array of items) on every request.", "P3", warning=not ctx.strict)
    elif value == [] or value == "":
        yield Problem("empty_input", "input",
                      "'input' is empty. Send at least one item (DeepSeek keeps no conversation state).",
                      "P3", warning=not ctx.strict)


# --- messages and content (P4, P5, P6) ------------------------------------------------------------------


def rule_messages(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    for i in ctx.shape.kept:
        item = ctx.shape.items[i]
        if ctx.shape.kinds[i] != "message":
            continue
        role = item["role"]  # type: ignore[typeddict-item]
        if role not in ROLES:
            # No refusal of an unknown role is known on this route: forwarded (docs/rules-responses.md, P4).
            fix = (" Tool results are function_call_output items." if role == "tool"
                   else " latest_reminder is a Chat Completions and Messages feature, not a Responses one."
                   if role == "latest_reminder" else " DeepSeek documents user, assistant, system and "
                   "developer.")
            yield Problem("unknown_role", f"input[{i}].role",
                          f"input[{i}].role '{role}' is not a role DeepSeek documents for /responses; "
                          f"forwarded as sent.{fix}", "P4", warning=not ctx.strict)
            continue
        content = item["content"]  # type: ignore[typeddict-item]
        for j, part in enumerate(content if isinstance(content, list) else ()):
            yield from _part(ctx, i, item, j, part, role)


def _part(ctx: ResponsesContext, i: int, item: Item, j: int, part: Any, role: str,
          param: str | None = None) -> Iterator[Problem]:
    kind = part["type"]
    param = param or f"input[{i}].content[{j}]"
    if kind == "input_image":
        if role in ("system", "assistant"):
            yield Problem("image_not_allowed_here", param,
                          f"{where(i, item)}: {param.split('.', 1)[1]} is an image; DeepSeek accepts images "
                          "only in user and developer messages and in tool outputs. Move it into a user "
                          "message.", "P6")
        elif not ctx.profile.vision:
            yield Problem("image_not_supported", param,
                          f"{where(i, item)}: {param.split('.', 1)[1]} is an image, but model "
                          f"'{ctx.request.model}' does not support images (DeepSeek may replace it with a "
                          "placeholder or refuse it). Use a vision model such as 'deepseek-flash'.", "P6",
                          warning=not ctx.strict)
    elif kind not in ("input_text", "output_text"):
        files = " DeepSeek's Responses API accepts no files." if kind == "input_file" else ""
        yield Problem("unsupported_content_part", f"{param}.type",
                      f"{where(i, item)}: {param.split('.', 1)[1]} has type '{kind}'; DeepSeek documents "
                      f"input_text, output_text and input_image parts only.{files}", "P5",
                      warning=not ctx.strict)


def rule_output_parts(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    """P5/P6 inside tool outputs: images are allowed there (on vision models)."""
    for i in ctx.shape.kept:
        item = ctx.shape.items[i]
        output = item.get("output") if ctx.shape.kinds[i] in OUTPUTS else None
        for j, part in enumerate(output if isinstance(output, list) else ()):
            yield from _part(ctx, i, item, j, part, "tool", f"input[{i}].output[{j}]")


# --- calls and their outputs (P7, P8, P9, P10) -----------------------------------------------------------


def rule_call_ids(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    for i in ctx.shape.kept:
        item = ctx.shape.items[i]
        kind = ctx.shape.kinds[i]
        if kind in CALLS:
            call_id = item["call_id"]  # type: ignore[typeddict-item]
            if not call_id:
                yield Problem("invalid_call_id", f"input[{i}].call_id",
                              f"{where(i, item)}: call_id is empty; it must be non-empty and unique. Keep "
                              "the call_id DeepSeek returned.", "P7",
                              warning=kind != "function_call" and not ctx.strict)
            elif call_id in seen:
                yield Problem("duplicate_call_id", f"input[{i}].call_id",
                              f"{where(i, item)}: call_id {call_id!r} is already used by "
                              f"input[{seen[call_id]}]; call ids must be unique in a request.", "P7",
                              warning=kind != "function_call" and not ctx.strict)
            else:
                seen[call_id] = i
        elif kind in OUTPUTS and "call_id" not in item:
            fix = ("Send the call_id of the call it answers, or drop it (or enable the "
                   "responses_orphan_outputs repair).")
            item_id = item.get("id")
            with_id = f" with id {item_id!r}" if isinstance(item_id, str) else ""
            yield Problem("missing_call_id", f"input[{i}].call_id",
                          f"input[{i}]: missing field `call_id` ({kind}{with_id}). {fix}", "P8",
                          warning=kind != "function_call_output" and not ctx.strict)


def rule_outputs(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    """P9: every output answers a call; a second output for the same call is an inference (warned)."""
    shape = ctx.shape
    for call_id, outputs in shape.outputs.items():
        for n, i in enumerate(outputs):
            item = shape.items[i]
            custom = kind_of(item) == "custom_tool_call_output"
            if call_id not in shape.calls:
                yield Problem("tool_output_without_call", f"input[{i}].call_id",
                              f"No tool call found for tool output with call_id {call_id} ({where(i, item)}: "
                              "no call in 'input' has this call_id). Drop the output or send its call first "
                              "(or enable the responses_orphan_outputs repair).", "P9",
                              warning=custom and not ctx.strict)
            elif n:
                yield Problem("duplicate_tool_output", f"input[{i}].call_id",
                              f"{where(i, item)} answers call_id {call_id!r} again (input[{outputs[0]}] "
                              "already did). Send one output per call.", "P9", warning=not ctx.strict)


_HARD_GAP = ("reasoning", "function_call_output", "custom_tool_call_output")


def rule_adjacency(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    """P10: "No tool output found for tool call …": DeepSeek wants the outputs of a batch of calls directly
    after it; a user/developer/system message or a reasoning item in between fails (observed), other
    assistant-side items in between may merge into the same turn (uncertain: warned)."""
    shape = ctx.shape
    position = {i: n for n, i in enumerate(shape.sequence)}
    for batch in shape.batches:
        answered = {shape.items[j].get("call_id") for j in shape.runs[batch[0]]}
        after = position[batch[-1]] + 1
        for i in batch:
            item = shape.items[i]
            call_id = item["call_id"]  # type: ignore[typeddict-item]
            if not call_id or call_id in answered or shape.calls.get(call_id, [i])[0] != i:
                continue  # P7 covers empty and repeated ids
            custom = kind_of(item) == "custom_tool_call"
            outputs = shape.outputs.get(call_id, [])
            if not outputs:
                yield Problem("tool_output_missing", f"input[{i}]",
                              f"No tool output found for tool call {call_id} ({where(i, item)} has no "
                              f"{'custom_tool_call_output' if custom else 'function_call_output'} in "
                              "'input'). Every call must be answered: add its output directly after the call "
                              "(or enable the responses_unanswered_calls repair).", "P10",
                              warning=custom and not ctx.strict)
                continue
            j = outputs[0]
            gap = [shape.items[k] for k in shape.sequence[after:position[j]]] if j > i else []
            hard = j < i or any(_hard(g) for g in gap)
            between = ("it comes before the call" if j < i else
                       "; ".join(dict.fromkeys(_gap_name(g) for g in gap)) + " in between")
            yield Problem("tool_output_not_adjacent", f"input[{i}]",
                          f"No tool output found for tool call {call_id}: DeepSeek wants each output "
                          f"directly after its call (strict adjacency), but the output of {where(i, item)} "
                          f"is input[{j}], with {between}. Move the output right after the call, and what "
                          "was between after the outputs (the responses_output_order repair does "
                          "this).", "P10",
                          warning=(custom or not hard) and not ctx.strict)


def _hard(item: Item) -> bool:
    """In the gap, this item certainly ends the assistant turn of the calls before it (observed)."""
    kind = kind_of(item)
    return kind in _HARD_GAP or (kind == "message" and item.get("role") != "assistant")


def _gap_name(item: Item) -> str:
    kind = kind_of(item)
    return f"a {item.get('role')} message" if kind == "message" else f"a {kind} item"


# --- thinking mode (P11) -----------------------------------------------------------------------------


def has_reasoning_text(item: Item) -> bool:
    content = item.get("content") if kind_of(item) == "reasoning" else None
    return isinstance(content, list) and any(isinstance(p.get("text"), str) and p["text"] for p in content)


def rule_reasoning(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    """P11: in thinking mode with tools, each assistant turn that calls a tool needs a reasoning item with
    non-empty `content` before its calls (an empty text and a summary-only item are refused too:
    docs/rules-responses.md, P11)."""
    if not ctx.thinking or not ctx.request.tools:
        return
    shape = ctx.shape
    items = shape.items
    position = {i: n for n, i in enumerate(shape.sequence)}
    for turn in shape.turns:
        kinds = [shape.kinds[i] for i in turn]
        first_act = next((n for n, k in enumerate(kinds) if k in (*CALLS, "message")), None)
        before = position[turn[0]] - 1
        follows_output = before >= 0 and shape.kinds[shape.sequence[before]] in OUTPUTS
        if first_act is None or any(has_reasoning_text(items[i]) for i in turn[:first_act]):
            continue
        calls = "function_call" in kinds
        if not calls and "custom_tool_call" not in kinds and not follows_output:
            continue  # a plain answer between user messages: its reasoning need not come back (as on chat)
        certain = calls and ctx.sure
        empty = next((i for i in turn[:first_act] if shape.kinds[i] == "reasoning"), None)
        act = turn[first_act]
        if empty is not None:
            what = ("has only a summary" if not items[empty].get("content") and items[empty].get("summary")
                    else "has no reasoning_text content" if not items[empty].get("content")
                    else "has an empty reasoning_text")
            param, detail = f"input[{empty}].content", f"the reasoning item input[{empty}] {what}"
        else:
            param, detail = f"input[{turn[0]}]", "no reasoning item comes before it"
        yield Problem("reasoning_text_missing", param,
                      "The `reasoning_text` in the thinking mode must be passed back to the API: "
                      f"{where(act, items[act])} is an assistant turn in thinking mode with tools, and "
                      f"{detail}. Send back the reasoning item DeepSeek returned (with its content) before "
                      "the turn, or set reasoning.effort = "
                      "\"none\".", "P11", warning=not certain and not ctx.strict)


# --- tools and tool_choice (P12, P13, P14) ----------------------------------------------------------------

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


def rule_tools(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    names: dict[str, int] = {}
    for k, tool in enumerate(ctx.request.tools or ()):
        kind = tool["type"]
        if kind == "function":
            name = tool["name"]  # type: ignore[typeddict-item]
            if not _FUNCTION_NAME.match(name):
                yield Problem("invalid_function_name", f"tools[{k}].name",
                              f"Invalid 'tools[{k}].name': string does not match pattern. Expected a "
                              "non-empty string of at most 128 characters matching '^[a-zA-Z0-9_-]+$'; got "
                              f"{name!r}. Replace '.', ':', spaces and non-ASCII characters with '_'.", "P12")
            elif name in names:
                yield Problem("invalid_function_name", f"tools[{k}].name",
                              f"Invalid 'tools[{k}].name': '{name}' is already defined by "
                              f"tools[{names[name]}]; function names must be unique.", "P12")
            names.setdefault(name, k)
        elif kind == "custom":
            name = tool["name"]  # type: ignore[typeddict-item]
            if name != "apply_patch":
                yield Problem("unsupported_custom_tool", f"tools[{k}].name",
                              f"tools[{k}] is the custom tool '{name}'; DeepSeek supports only the custom "
                              "tool {\"type\": \"custom\", \"name\": \"apply_patch\"}. Define it as a "
                              "function tool instead.", "P13")
        elif kind in SERVER_TOOLS:
            note = server_tool_model_note(kind, ctx.request.model, ctx.profile.name)
            if note is not None:
                yield Problem("server_tool_model", f"tools[{k}].type", note, "P13", warning=not ctx.strict)
        elif kind in IGNORED_TOOLS or kind.startswith("computer_use"):
            yield Problem("ignored_tool", f"tools[{k}].type",
                          f"tools[{k}] has type '{kind}', which DeepSeek documents as ignored (it runs "
                          "function, custom apply_patch, web_search and its own deepseek_web_search / "
                          "deepseek_read_url tools): the model will not see it.", "P13", warning=True)
        elif not kind.startswith("web_search"):
            yield Problem("unknown_tool_type", f"tools[{k}].type",
                          f"tools[{k}] has type '{kind}', which DeepSeek does not document for /responses; "
                          "forwarded as sent.", "P13", warning=True, notice=kind in CLIENT_OWN_TOOLS)


# Tool types a client defines for itself, which its user cannot take out (Codex groups its sub-agent tools
# in a `namespace`): a notice, not a warning on every request.
CLIENT_OWN_TOOLS = frozenset({"namespace"})
IGNORED_TOOLS = frozenset({"file_search", "code_interpreter", "mcp"})  # DOC-resp: "ignored"
TOOL_CHOICES = ("none", "auto", "required")


def rule_tool_choice(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    choice = ctx.request.tool_choice
    if choice is None:
        return
    tools = ctx.request.tools or []
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            yield Problem("invalid_tool_choice", "tool_choice",
                          f"tool_choice: unknown variant `{choice}`, expected one of `none`, `auto`, "
                          "`required` or an object such as {\"type\": \"function\", \"name\": …}.", "P14")
        elif choice == "required":
            yield from _forced(ctx, "'required'")
        return
    kind = choice.type
    if kind.startswith("web_search"):
        if not any(t["type"].startswith("web_search") for t in tools):
            yield Problem("web_search_not_enabled", "tool_choice.type",
                          f"tool_choice forces '{kind}', but 'tools' has no web_search tool. Add {{\"type\": "
                          "\"web_search\"} to 'tools' or use tool_choice \"auto\".", "P14")
        return
    if kind in ("function", "custom"):
        if not choice.name:
            yield Problem("invalid_tool_choice", "tool_choice.name",
                          f"tool_choice of type \"{kind}\" needs the 'name' of the tool to call.", "P14")
            return
        if not any(t["type"] == kind and t.get("name") == choice.name for t in tools):
            yield Problem("invalid_tool_choice", "tool_choice.name",
                          f"tool_choice names the {kind} tool '{choice.name}', which is not in "
                          "'tools'.", "P14",
                          warning=not ctx.strict)
        yield from _forced(ctx, f"the {kind} '{choice.name}'")
        return
    yield Problem("invalid_tool_choice", "tool_choice.type",
                  f"tool_choice of type '{kind}' is not documented by DeepSeek (none, auto, required, "
                  "function, web_search).", "P14", warning=not ctx.strict)


def _forced(ctx: ResponsesContext, what: str) -> Iterator[Problem]:
    if ctx.thinking:
        yield Problem("tool_choice_in_thinking", "tool_choice",
                      f"tool_choice forces {what} while model '{ctx.request.model}' thinks; DeepSeek's chat "
                      "API refuses that in thinking mode (its Responses documentation lists it without a "
                      "caveat). If DeepSeek refuses it, use \"auto\" or set reasoning.effort = "
                      "\"none\".", "P14", warning=True)


# --- parameters (P15-P20) ------------------------------------------------------------------------------

_USER = re.compile(r"^[a-zA-Z0-9_-]+$")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
TEXT_FORMATS = ("text", "json_object", "json_schema")


def rule_parameters(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    req = ctx.request
    if req.user is not None:
        yield from _user(req.user, ctx)
    if req.safety_check is not None and req.safety_check.level is not None \
            and req.safety_check.level not in SAFETY_LEVELS:  # P23 (guides/safety, 2026-11)
        yield Problem("invalid_safety_check", "safety_check.level",
                      safety_level_message("safety_check.level", req.safety_check.level), "P23")
    # No effect in thinking mode (docs/rules-responses.md); whether DeepSeek range-checks them then is
    # unknown.
    if not ctx.thinking or ctx.strict:
        yield from in_range("temperature", req.temperature, 0, 2, "P16")
        yield from in_range("top_p", req.top_p, 0, 1, "P16")
    yield from in_range("top_logprobs", req.top_logprobs, 0, 20, "P16")
    top = ctx.profile.max_tokens_max
    if req.max_output_tokens is not None and not 1 <= req.max_output_tokens <= top:
        bound = f"[1, {top}]" if ctx.known else "[1, …]"
        yield Problem("max_output_tokens_out_of_range", "max_output_tokens",
                      f"Invalid max_output_tokens value, the valid range is {bound} for model '{req.model}' "
                      "(it counts the reasoning and the visible output); got "
                      f"{req.max_output_tokens}.", "P17")
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type not in TEXT_FORMATS:
        yield Problem("unsupported_text_format", "text.format.type",
                      f"text.format.type '{fmt.type}' is not one of {', '.join(TEXT_FORMATS)}.", "P18",
                      warning=not ctx.strict)
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None and effort not in EFFORTS:
        yield Problem("invalid_effort", "reasoning.effort",
                      f"reasoning.effort '{effort}' is not one of {', '.join(EFFORTS)} (DeepSeek maps them "
                      "to none, low, high and max).", "P19", warning=not ctx.strict)
    yield from _stateless(req)


def _user(user: str, ctx: ResponsesContext) -> Iterator[Problem]:
    """P15: over 512 UTF-8 bytes is refused; other characters than DeepSeek recommends are a warning (the
    character set is only recommended since 2026-11)."""
    size = user_id_too_long(user)
    if size is not None:
        yield Problem("invalid_user", "user",
                      f"Invalid 'user': {size} UTF-8 bytes; DeepSeek accepts at most {USER_ID_MAX_BYTES}. "
                      "Send a hash or a shorter id.", "P15")
    elif not _USER.match(user):
        yield Problem("invalid_user", "user",
                      "'user' has characters other than the letters, digits, '_' and '-' DeepSeek recommends "
                      "(or is empty); forwarded, DeepSeek accepts up to 512 UTF-8 bytes.", "P15",
                      warning=not ctx.strict)


def _stateless(req: ResponsesRequest) -> Iterator[Problem]:
    """P20: DeepSeek stores nothing; these are silently ignored (docs/rules-responses.md), which the client
    may not expect."""
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            yield Problem("stateless_field_ignored", name,
                          f"'{name}' is ignored: DeepSeek stores no responses or conversations, so the model "
                          "sees only what 'input' holds. Send the whole history in 'input' (as Codex does "
                          "with store: false).", "P20", warning=True)
    if req.background is True:
        yield Problem("stateless_field_ignored", "background",
                      "'background' is ignored by DeepSeek: the response is produced in the request.", "P20",
                      warning=True)
    if req.truncation == "auto":
        yield Problem("stateless_field_ignored", "truncation",
                      "truncation \"auto\" is ignored by DeepSeek: an input over the context window is a "
                      "400, not truncated.", "P20", warning=True)


# --- what DeepSeek ignores in the input (P21, P22) -----------------------------------------------------


DEEPSEEK_ITEMS = "deepseek_"
IGNORED_HINTS = {
    "agent_message": " A sub-agent's task sent this way never reaches the model: send it as a user message.",
    "compaction_trigger": " DeepSeek has no remote compaction: give the Codex provider a name other than "
                          "\"OpenAI\" so that Codex compacts locally.",
    "compaction": " DeepSeek cannot expand OpenAI's compaction items: the history they stand for is lost.",
}


def rule_ignored_items(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    seen: dict[str, list[int]] = {}
    for i, kind in enumerate(ctx.shape.kinds):
        # DeepSeek's own output items (its server tools' results, shape not documented) are passed back as
        # sent: the web_tools guide asks for exactly that.
        if kind not in ITEM_TYPES and not kind.startswith(DEEPSEEK_ITEMS):
            seen.setdefault(kind, []).append(i)
    for kind, where_ in seen.items():
        hint = IGNORED_HINTS.get(kind, "")
        more = f" (and {len(where_) - 1} more)" if len(where_) > 1 else ""
        yield Problem("ignored_item", f"input[{where_[0]}].type",
                      f"input[{where_[0]}]{more} has type '{kind}', which DeepSeek ignores: the model does "
                      f"not see it.{hint}", "P21", warning=True)


def rule_encrypted_content(req: ResponsesRequest, ctx: ResponsesContext) -> Iterator[Problem]:
    foreign = [i for i in ctx.shape.kept if ctx.shape.kinds[i] == "reasoning"
               and str(ctx.shape.items[i].get("encrypted_content") or "").startswith(OPENAI_BLOB)]
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        yield Problem("foreign_encrypted_content", f"input[{foreign[0]}].encrypted_content",
                      f"input[{foreign[0]}]{more} carries OpenAI's encrypted reasoning (encrypted_content "
                      f"starting '{OPENAI_BLOB}'), which DeepSeek cannot read and ignores; only a reasoning "
                      "item's plain content reaches the model (enable the responses_strip_encrypted repair "
                      "to stop sending it).", "P22", warning=True)


RULES: tuple[Rule[ResponsesRequest, ResponsesContext], ...] = (
    rule_model, rule_input, rule_messages, rule_output_parts, rule_call_ids, rule_outputs, rule_adjacency,
    rule_reasoning, rule_tools, rule_tool_choice, rule_parameters, rule_ignored_items, rule_encrypted_content,
)
