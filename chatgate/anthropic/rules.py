"""Request rules of DeepSeek's Anthropic-format route (docs/rules-anthropic.md, A1-A24) as pure functions.

What that page marks certain is enforced (a 400 in Anthropic's shape); what it marks uncertain is a warning
(forwarded, `x-chatgate-warning`) and refused only in strict mode: a false alarm breaks Claude Code, a miss
only costs DeepSeek's own 400. DeepSeek's wording is quoted where it is known, so clients that match on it
keep working. `param` paths use chatgate's style (`messages[3].content[1]`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from chatgate.anthropic.protocol import SUPPORTED_BLOCKS, UNSUPPORTED_BLOCKS, Message, MessagesRequest
from chatgate.anthropic.type_errors import problems_from_validation_error
from chatgate.errors import Problem
from chatgate.profiles import DEFAULT_PROFILES, ModelProfile, generic_profile
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


@dataclass(slots=True)
class MessagesContext(RuleContext):
    """`known`: a DeepSeek profile, or a claude* name DeepSeek maps to one."""

    thinking: bool
    policy: Policy


def model_profile(model: str, profiles: Mapping[str, ModelProfile]) -> tuple[ModelProfile, bool]:
    """The profile DeepSeek serves a name with: claude-opus* -> v4-pro, other claude* -> flash
    (docs/rules-anthropic.md#the-route)."""
    name = model.removesuffix("[1m]")
    if name in profiles:
        return profiles[name], True
    if name.startswith("claude"):
        target = "deepseek-v4-pro" if name.startswith("claude-opus") else "deepseek-flash"
        return profiles.get(target, DEFAULT_PROFILES[target]), True
    return generic_profile(model), False


def check_body(body: bytes, policy: Policy, parse: object = None) -> Verdict:
    """Parse and check a Messages request body (`parse`: R1's, chatgate/wire.py `validate_body`); never
    raises."""
    try:
        request = validate_body(MessagesRequest, body, parse)
    except pydantic.ValidationError as exc:
        found = problems_from_validation_error(exc)
        return checked_beside_type_errors(found, exc, body, ("model", "messages"), MessagesRequest,
                                          lambda rest: check_request(rest, policy))
    return check_request(request, policy)


def check_request(request: MessagesRequest, policy: Policy) -> Verdict:
    profile, known = model_profile(request.model, policy.profiles)
    thinking = known and not profile.non_thinking_only and not (
        request.thinking is not None and request.thinking.type == "disabled")
    ctx = MessagesContext(profile, known, policy.options, thinking, policy)
    problems, warnings = run_rules(RULES, request, ctx, ORDERING)
    client_tools = any((t.get("type") or "custom") == "custom" for t in request.tools or ())
    return Verdict(problems, warnings, request.model, request.stream is True, thinking, client_tools,
                   request.max_tokens, profile, request=request)


ORDERING = Ordering("messages", parts=True)


def where(i: int, msg: Message) -> str:
    return f"messages[{i}] (role {msg['role']})"


def _blocks(msg: Message) -> list[Any]:
    content = msg["content"]
    return content if isinstance(content, list) else []


REMINDER = "latest_reminder"  # DeepSeek's role for the context line before a user message (2026-11)


def _after(msgs: list[Message], i: int) -> int:
    """The index of the message after msgs[i], a latest_reminder passed over (len(msgs) if none)."""
    k = i + 1
    while k < len(msgs) and msgs[k]["role"] == REMINDER:
        k += 1
    return k


def _before(msgs: list[Message], i: int) -> int:
    """The index of the message before msgs[i], a latest_reminder passed over (-1 if none)."""
    k = i - 1
    while k >= 0 and msgs[k]["role"] == REMINDER:
        k -= 1
    return k


# --- the model and max_tokens (A2, A18, A19) ---------------------------------------------------------


def rule_model(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    if req.model.endswith("[1m]"):
        yield Problem("model_suffix", "model",
                      f"model '{req.model}' ends with '[1m]': Claude Code strips that suffix before sending; "
                      f"DeepSeek does not know it. Send '{req.model.removesuffix('[1m]')}' (or enable the "
                      "model_suffix repair).", "A19", warning=True)
    elif not ctx.known and not ctx.policy.served(req.model):
        # A18: DeepSeek maps every claude* name to a model of its own and answers other unknown names 400
        yield unknown_model(req.model, "anthropic", "A18", ctx.policy.suggestions(), ctx.options)


def rule_max_tokens(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    top = ctx.profile.max_tokens_max
    if not 1 <= req.max_tokens <= top:
        bound = f"[1, {top}]" if ctx.known else "[1, …]"
        yield Problem("max_tokens_out_of_range", "max_tokens",
                      f"Invalid max_tokens value, the valid range of max_tokens is {bound} for model "
                      f"'{req.model}'; got {req.max_tokens}.", "A2")


# --- messages (A3, A6, A7, A8) ---------------------------------------------------------------------------


def rule_roles(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    if not req.messages:
        yield Problem("empty_array", "messages",
                      "Invalid 'messages': empty array. Send at least one message.", "A1")
    for i, msg in enumerate(req.messages):
        role = msg["role"]
        if role in ("user", "assistant"):
            continue
        if role == REMINDER:
            yield from _reminder_place(req.messages, i, ctx)
        elif role in ("system", "tool"):  # both seen refused by DeepSeek (docs/rules-anthropic.md, A3)
            fix = ("move it into the top-level 'system' (or enable the system_messages repair)"
                   if role == "system" else "tool results are 'tool_result' blocks in a user message")
            yield Problem("invalid_role", f"messages[{i}].role",
                          f"messages[{i}].role: unknown variant `{role}`, expected `user` or `assistant`: "
                          f"{fix}.", "A3")
        else:
            yield Problem("unknown_role", f"messages[{i}].role",
                          f"messages[{i}].role '{role}' is not a role chatgate knows on this route (DeepSeek "
                          "documents user, assistant and latest_reminder); forwarded as sent.", "A3",
                          warning=not ctx.strict)


def _reminder_place(msgs: list[Message], i: int, ctx: MessagesContext) -> Iterator[Problem]:
    """A3: DeepSeek documents latest_reminder directly before its user message; elsewhere it is not known
    to refuse it."""
    if i + 1 < len(msgs) and msgs[i + 1]["role"] == "user":
        return
    yield Problem("latest_reminder_placement", f"messages[{i}].role",
                  f"messages[{i}] is a latest_reminder that is not directly before a user message, where "
                  "DeepSeek documents it; forwarded as sent.", "A3", warning=not ctx.strict)


def rule_not_empty(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    for i, msg in enumerate(req.messages):
        if isinstance(msg["content"], list) and not msg["content"]:
            fix = (" (or enable the empty_assistant repair)" if msg["role"] == "assistant" else "")
            yield Problem("empty_content", f"messages[{i}].content",
                          f"messages.{i}: all messages must have non-empty content ({where(i, msg)} has an "
                          f"empty content array). Send at least one block, or drop the message{fix}.", "A6")


def _tool_uses(msg: Message) -> list[tuple[int, str]]:
    """(block index, id) of the client tool calls of an assistant message (server tools run at DeepSeek)."""
    return [(j, b["id"]) for j, b in enumerate(_blocks(msg)) if b.get("type") == "tool_use"]


def _tool_results(msg: Message) -> list[tuple[int, str]]:
    return [(j, b["tool_use_id"]) for j, b in enumerate(_blocks(msg)) if b.get("type") == "tool_result"]


def rule_tool_results(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    msgs = req.messages
    for i, msg in enumerate(msgs):
        if msg["role"] != "assistant":
            continue
        uses = _tool_uses(msg)
        after = _after(msgs, i)
        if not uses or after == len(msgs):
            continue
        following = msgs[after]
        answered = {tid for _, tid in _tool_results(following)} if following["role"] == "user" else set()
        missing = [tid for _, tid in uses if tid not in answered]
        if missing:
            later = any(tid in {t for _, t in _tool_results(m)} for m in msgs[after + 1:] for tid in missing)
            hint = (" They are answered in a later message: merge the tool_result blocks into the message "
                    "right "
                    "after (or enable the split_tool_results repair)." if later else
                    " Add a tool_result block for each id to the next (user) message.")
            yield Problem("tool_use_unanswered", f"messages[{i}].content",
                          f"messages.{i}:`tool_use` ids were found without `tool_result` blocks immediately "
                          f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                          f"`tool_result` block in the next message.{hint}", "A7")


def rule_tool_result_ids(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    """A8: a tool_result answers a tool_use of the assistant message right before it (an inference:
    refused in strict mode only)."""
    msgs = req.messages
    for i, msg in enumerate(msgs):
        results = _tool_results(msg) if msg["role"] == "user" else []
        if not results:
            continue
        k = _before(msgs, i)
        previous = msgs[k] if k >= 0 else None
        assistant = previous is not None and previous["role"] == "assistant"
        before = {tid for _, tid in _tool_uses(previous)} if previous is not None and assistant else set()
        for j, tid in results:
            if tid not in before:
                yield Problem("unknown_tool_use_id", f"messages[{i}].content[{j}].tool_use_id",
                              f"{where(i, msg)}: content[{j}] answers tool_use_id '{tid}', which is not a "
                              f"tool_use "
                              f"of messages[{k}]. Keep each tool_result right after the assistant "
                              f"message "
                              "that called the tool.", "A8", warning=not ctx.strict)


# --- content blocks (A4, A5, A9, A16) ---------------------------------------------------------------

IMAGE_MEDIA = ("image/jpeg", "image/png", "image/gif", "image/webp")


def rule_blocks(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    for i, msg in enumerate(req.messages):
        for j, block in enumerate(_blocks(msg)):
            kind = block.get("type")
            param = f"messages[{i}].content[{j}]"
            if kind in UNSUPPORTED_BLOCKS:
                fix = " (or enable the redacted_thinking repair)" if kind == "redacted_thinking" else ""
                yield Problem("unsupported_block", f"{param}.type",
                              f"{where(i, msg)}: content[{j}] is a '{kind}' block, which DeepSeek documents "
                              f"as "
                              f"not supported. Remove it{fix}.", "A5", warning=not ctx.strict)
            elif kind not in SUPPORTED_BLOCKS:
                yield Problem("unsupported_block", f"{param}.type",
                              f"{where(i, msg)}: content[{j}] has type '{kind}', which is not among the "
                              f"block "
                              f"types DeepSeek accepts ({', '.join(SUPPORTED_BLOCKS)}).", "A4",
                              warning=not ctx.strict)
            elif kind == "image":
                yield from _image(req, ctx, i, msg, j, block)
            elif kind == "tool_result" and isinstance(block.get("content"), list):
                for k, inner in enumerate(block["content"]):
                    if inner.get("type") == "image":
                        yield from _image(req, ctx, i, msg, j, inner, f"{param}.content[{k}]")


def _image(req: MessagesRequest, ctx: MessagesContext, i: int, msg: Message, j: int, block: Any,
           param: str | None = None) -> Iterator[Problem]:
    param = param or f"messages[{i}].content[{j}]"
    if not ctx.profile.vision:
        yield Problem("image_not_supported", param,
                      f"{where(i, msg)}: {param.split('.', 1)[1]} is an image, but model '{req.model}' does "
                      "not support images. Use a vision model such as 'deepseek-flash', or remove the block.",
                      "A16")
        return
    source = block["source"]
    kind = source.get("type")
    if kind not in ("base64", "url", "file"):
        yield Problem("invalid_image", f"{param}.source.type",
                      f"{where(i, msg)}: {param.split('.', 1)[1]}.source.type '{kind}' is not base64, url or "
                      "file.", "A16")
    elif kind == "base64" and source.get("media_type") not in IMAGE_MEDIA:
        yield Problem("invalid_image", f"{param}.source.media_type",
                      f"{where(i, msg)}: {param.split('.', 1)[1]}.source.media_type "
                      f"'{source.get('media_type')}' is not one of {', '.join(IMAGE_MEDIA)}.", "A16")


# --- thinking (A10, A11, A12, A13, A14) --------------------------------------------------------------

THINKING_TYPES = ("enabled", "disabled", "adaptive")
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max", "ultra")


def rule_thinking_passed_back(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    """A10: a turn with a client `tool_use` keeps its thinking block; a turn whose only calls are
    `server_tool_use` (web_search, run at DeepSeek) is not in A10's scope."""
    if not ctx.thinking:
        return
    for i, msg in enumerate(req.messages):
        if msg["role"] != "assistant" or not _tool_uses(msg):
            continue
        if not any(b.get("type") == "thinking" for b in _blocks(msg)):
            yield Problem("thinking_block_missing", f"messages[{i}].content",
                          "The `content[].thinking` in the thinking mode must be passed back to the API. "
                          f"{where(i, msg)} calls a tool without its thinking block: send back the thinking "
                          "block DeepSeek returned before the tool_use, or set thinking.type = \"disabled\".",
                          "A10")


def rule_thinking_params(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    if req.thinking is not None and req.thinking.type not in THINKING_TYPES:
        yield Problem("invalid_thinking", "thinking.type",
                      f"thinking.type: unknown variant `{req.thinking.type}`, expected one of `adaptive`, "
                      "`enabled`, `disabled`.", "A11")
    effort = req.output_config.effort if req.output_config is not None else None
    if effort is not None and effort not in EFFORTS:
        yield Problem("invalid_effort", "output_config.effort",
                      f"output_config.effort '{effort}' is not one of {', '.join(EFFORTS)} (DeepSeek maps "
                      f"these "
                      "to low, high and max).", "A14", warning=True)
    if effort is not None and req.thinking is not None and req.thinking.type == "disabled":
        yield Problem("thinking_disabled_with_effort", "output_config.effort",
                      "thinking options type cannot be disabled when reasoning_effort is set: thinking.type "
                      "is "
                      f"\"disabled\" and output_config.effort is '{effort}'. Remove output_config.effort (it "
                      "means nothing without thinking).", "A12", warning=not ctx.strict)


def rule_tool_choice(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    choice = req.tool_choice
    if choice is None:
        return
    if choice.type not in ("auto", "any", "tool", "none"):
        yield Problem("invalid_tool_choice", "tool_choice.type",
                      f"tool_choice.type: unknown variant `{choice.type}`, expected one of `auto`, `any`, "
                      f"`tool`, "
                      "`none`.", "A13")
        return
    if choice.type == "tool" and not choice.name:
        yield Problem("invalid_tool_choice", "tool_choice.name",
                      "tool_choice of type \"tool\" needs the 'name' of the tool to call.", "A13")
    if ctx.thinking and choice.type in ("tool", "any"):
        yield Problem("tool_choice_in_thinking", "tool_choice",
                      "Thinking mode does not support this tool_choice: a forced tool_choice "
                      f"({choice.type!r}) is refused while model '{req.model}' thinks. Set thinking.type = "
                      "\"disabled\" or use tool_choice \"auto\" (or enable the forced_tool_choice repair).",
                      "A13", warning=choice.type == "any" and not ctx.strict)


# --- sampling, metadata, tools (A15, A17, A20) --------------------------------------------------------


def rule_sampling(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    if ctx.thinking and not ctx.strict:  # ignored in thinking mode (thinking_mode guide)
        return
    yield from in_range("temperature", req.temperature, 0, 2, "A20")
    yield from in_range("top_p", req.top_p, 0, 1, "A20")


_USER_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def rule_user_id(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    """A15: over 512 UTF-8 bytes is refused; other characters than DeepSeek recommends are a notice (Claude
    Code's JSON user id; DeepSeek only recommends the character set since 2026-11)."""
    user_id = req.metadata.user_id if req.metadata is not None else None
    if user_id is None:
        return
    size = user_id_too_long(user_id)
    if size is not None:
        yield Problem("invalid_user_id", "metadata.user_id",
                      f"Invalid 'metadata.user_id': {size} UTF-8 bytes; DeepSeek accepts at most "
                      f"{USER_ID_MAX_BYTES}. Send a shorter id (or enable the user_id repair).", "A15")
    elif not _USER_ID.match(user_id):
        yield Problem("invalid_user_id", "metadata.user_id",
                      "'metadata.user_id' has characters other than the letters, digits, '_' and '-' "
                      "DeepSeek recommends (it refused them for one day, 2026-05-06); forwarded. Enable the "
                      "user_id repair to send a sanitised id.", "A15", warning=not ctx.strict,
                      notice=not ctx.strict)


def rule_safety_check(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    """A24: `safety_check.level` is high or low (guides/safety, 2026-11)."""
    check = req.safety_check
    if check is not None and check.level is not None and check.level not in SAFETY_LEVELS:
        yield Problem("invalid_safety_check", "safety_check.level",
                      safety_level_message("safety_check.level", check.level), "A24")


# Anthropic's own server tools that a report says fail the whole request on DeepSeek (bifrost #7093)
REPORTED_FAILING = ("web_fetch", "code_execution", "computer", "bash", "memory", "text_editor", "mcp_toolset")


def rule_server_tools(req: MessagesRequest, ctx: MessagesContext) -> Iterator[Problem]:
    """A17: DeepSeek's own server tools and Anthropic's web_search run at DeepSeek; a type chatgate does not
    know (Claude Code's advisor_*, tool_search, …) is forwarded with a warning."""
    for k, tool in enumerate(req.tools or ()):
        kind = tool.get("type") or "custom"
        if kind == "custom" and "name" not in tool:
            yield Problem("missing_required_parameter", f"tools[{k}].name",
                          f"Missing required parameter: 'tools[{k}].name'.", "A17")
        if kind == "custom" or kind.startswith("web_search"):
            continue
        if kind in SERVER_TOOLS:
            note = server_tool_model_note(kind, req.model, ctx.profile.name)
            if note is not None:
                yield Problem("server_tool_model", f"tools[{k}].type", note, "A17", warning=not ctx.strict)
        elif kind.startswith(REPORTED_FAILING):
            yield Problem("unsupported_server_tool", f"tools[{k}].type",
                          f"tools[{k}] is Anthropic's server tool '{kind}'; DeepSeek runs web_search and its "
                          "own deepseek_web_search / deepseek_read_url, and this one is reported to fail the "
                          "whole request.", "A17", warning=not ctx.strict)
        else:
            yield Problem("unsupported_server_tool", f"tools[{k}].type",
                          f"tools[{k}] has type '{kind}', which chatgate does not know on this route; "
                          "forwarded as sent.", "A17", warning=not ctx.strict)


RULES: tuple[Rule[MessagesRequest, MessagesContext], ...] = (
    rule_model, rule_max_tokens, rule_roles, rule_not_empty, rule_tool_results, rule_tool_result_ids,
    rule_blocks, rule_thinking_passed_back, rule_thinking_params, rule_tool_choice, rule_sampling,
    rule_user_id, rule_safety_check, rule_server_tools,
)
