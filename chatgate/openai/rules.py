"""Request rules (docs/rules-chat.md, R1-R42) as pure functions over the parsed request.

`check_body` parses the bytes once with pydantic and returns every problem found; the
proxy answers 400 when there is any. Rules marked uncertain there (U1-U12) are warnings (the
request is forwarded) or fire only with `strict` on: a false alarm costs the user more
than a miss.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.openai.protocol import (
    REFUSED_ROLES,
    AssistantMessage,
    ChatCompletionRequest,
    FilePart,
    FileRef,
    ImageURLPart,
    LenientRequest,
    Message,
    ToolMessage,
    UserMessage,
)
from chatgate.openai.type_errors import problems_from_validation_error
from chatgate.profiles import ModelProfile
from chatgate.rules.kernel import Ordering, Rule, RuleContext, beside_type_errors, in_range, run_rules
from chatgate.rules.models import Policy, unknown_model
from chatgate.surface import (
    SAFETY_LEVELS,
    SERVER_TOOLS,
    USER_ID_MAX_BYTES,
    safety_level_message,
    server_tool_model_note,
    user_id_too_long,
)
from chatgate.wire import validate_body


@dataclass(slots=True)
class MessageIndex:
    """One pass over the messages, so that each rule visits only the messages it is about."""

    roles: list[str]
    assistants: list[tuple[int, AssistantMessage]]
    with_calls: list[tuple[int, AssistantMessage]]  # assistants with non-empty tool_calls
    arrays: list[tuple[int, UserMessage | ToolMessage]]  # content given as an array of parts
    tools: dict[int, str]  # position of each tool message -> its tool_call_id
    other_arrays: bool = False  # another message's content is an array (a latest_reminder's may be)
    unknown: tuple[int, ...] = ()  # messages whose role chatgate does not know (read by the lenient pass)

    @property
    def media(self) -> bool:
        """Whether an image (or another part that is not text) can be in the messages at all."""
        return bool(self.arrays) or self.other_arrays


def index_messages(messages: list[Message]) -> MessageIndex:
    roles: list[str] = []
    assistants: list[tuple[int, AssistantMessage]] = []
    with_calls: list[tuple[int, AssistantMessage]] = []
    arrays: list[tuple[int, UserMessage | ToolMessage]] = []
    tools: dict[int, str] = {}
    other_arrays = False
    unknown: list[int] = []
    for i, msg in enumerate(messages):
        roles.append(msg["role"])
        if msg["role"] == "assistant":
            assistants.append((i, msg))
            if msg.get("tool_calls"):
                with_calls.append((i, msg))
        elif msg["role"] == "tool":
            tools[i] = msg["tool_call_id"]
            if type(msg["content"]) is list:
                arrays.append((i, msg))
        elif msg["role"] == "user":
            if type(msg["content"]) is list:
                arrays.append((i, msg))
        else:
            other_arrays = other_arrays or type(msg.get("content")) is list
            if msg["role"] != "system" and msg["role"] != "latest_reminder":
                unknown.append(i)
    return MessageIndex(roles, assistants, with_calls, arrays, tools, other_arrays, tuple(unknown))


@dataclass(slots=True)
class ChatContext(RuleContext):
    beta: bool
    thinking: bool
    policy: Policy
    index: MessageIndex
    origin: str | None  # chatgate's own address as the client used it, for hints; None offline

    def beta_hint(self) -> str:
        where = f" (chatgate: {self.origin}/beta)" if self.origin else ""
        return f"set base_url to …/beta{where}"


@dataclass(slots=True)  # not frozen: one per request (frozen costs a call per field)
class Checked:
    request: ChatCompletionRequest | None
    problems: list[Problem]
    profile: ModelProfile | None = None
    warnings: list[Problem] = field(default_factory=list)
    thinking: bool = False  # the request runs in thinking mode (docs/rules-chat.md)
    media: bool = True  # the messages may hold images (False: no content array at all)
    answers: list[tuple[int, AssistantMessage]] | None = None  # the assistant messages, by position

    @property
    def ok(self) -> bool:
        return not self.problems


def check_body(body: bytes, policy: Policy, *, beta: bool = False, origin: str | None = None,
               parse: object = None) -> Checked:
    """Parse and check a request body; never raises. `origin` (e.g. http://127.0.0.1:8787) is where the
    client reached chatgate, named in hints."""
    try:
        request = validate_body(ChatCompletionRequest, body, parse)
    except pydantic.ValidationError as exc:
        if not _unknown_tag(exc):
            return _type_errors(exc, body, policy, beta, origin)
        try:  # a role or part type the fast pass does not know: unknown is not invalid (R5, R7); `developer`
            request = validate_body(LenientRequest, body)  # is refused by R5, beside every other problem
        except pydantic.ValidationError as again:  # the fast pass's errors name `developer`
            return _type_errors(exc if _refused_role(exc) else again, body, policy, beta, origin)
    return check_request(request, policy, beta=beta, origin=origin)


def _unknown_tag(exc: pydantic.ValidationError) -> bool:
    """Whether the fast pass failed on a role or part type it does not know."""
    return any(error["type"] == "union_tag_invalid" and error["loc"][:1] == ("messages",)
               for error in exc.errors(include_url=False, include_input=False))


def _refused_role(exc: pydantic.ValidationError) -> bool:
    return any(error["type"] == "union_tag_invalid" and len(error["loc"]) == 2
               and error["loc"][0] == "messages" and error["ctx"]["tag"] in REFUSED_ROLES
               for error in exc.errors(include_url=False, include_input=False))


def _type_errors(exc: pydantic.ValidationError, body: bytes, policy: Policy, beta: bool, origin: str | None
                 ) -> Checked:
    """The type errors, and what the rules find in the rest of the body (`beside_type_errors`)."""
    problems = problems_from_validation_error(exc, body)
    data = beside_type_errors(exc, body, ("messages", "model"))
    if data is None:
        return Checked(None, problems)
    try:
        rest = ChatCompletionRequest.model_validate(data)
    except pydantic.ValidationError:
        return Checked(None, problems)
    checked = check_request(rest, policy, beta=beta, origin=origin)
    return Checked(None, [*problems, *checked.problems], checked.profile, checked.warnings)


def check_request(request: ChatCompletionRequest, policy: Policy, *, beta: bool = False,
                  origin: str | None = None) -> Checked:
    profile, known = policy.profile_for(request.model)
    ctx = ChatContext(profile, known, policy.options, beta, is_thinking(request, profile, known), policy,
                      index_messages(request.messages), origin)
    problems, warnings = run_rules(RULES, request, ctx, ORDERING)
    return Checked(request, problems, profile, warnings, ctx.thinking, ctx.index.media, ctx.index.assistants)


def is_thinking(request: ChatCompletionRequest, profile: ModelProfile, known: bool) -> bool:
    """Thinking mode (docs/rules-chat.md): legacy reasoner always; V4/flash unless disabled or effort "none"
    (R36)."""
    if not known or profile.non_thinking_only:
        return False
    if profile.thinking_only:
        return True
    if request.thinking is not None and request.thinking.type == "disabled":
        return False
    if request.reasoning_effort == "none":
        return False
    if request.thinking is not None and request.thinking.type == "enabled":
        return True
    return profile.thinking_default


ORDERING = Ordering("messages")


def where(i: int, message: Message) -> str:
    return f"messages[{i}] (role {message['role']})"


# --- model and messages (R3, R4) -------------------------------------------------


def rule_model_known(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R3: a model DeepSeek does not serve (it answers "Model Not Exist")."""
    if not ctx.known and not ctx.policy.served(req.model):
        yield unknown_model(req.model, "chat", "R3", ctx.policy.suggestions(), ctx.options, "Model Not Exist")


def rule_messages_not_empty(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if not req.messages:
        yield Problem("empty_array", "messages",
                      "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                      "but got an empty array instead. Send at least one message.", "R4")


def rule_roles(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R5: a role chatgate does not know is forwarded with a warning. `developer`, which DeepSeek was seen
    refusing, is a type error of the fast pass; the lenient one meets it only in a large body whose fast
    pass stopped at an earlier unknown role."""
    for i in ctx.index.unknown:
        role = req.messages[i]["role"]
        if role in REFUSED_ROLES:
            yield Problem("invalid_role", f"messages[{i}].role",
                          f"messages[{i}].role '{role}' is not supported by DeepSeek; use 'system'.", "R5")
        else:
            yield Problem("unknown_role", f"messages[{i}].role",
                          f"messages[{i}].role '{role}' is not a role chatgate knows (DeepSeek documents "
                          "system, user, assistant, tool and latest_reminder); forwarded as sent.", "R5",
                          warning=not ctx.strict)


# --- content (R6-R9) ---------------------------------------------------------------

IMAGE_URL_MAX = 8192
IMAGES_MAX = 600
IMAGE_DETAILS = ("low", "high", "auto", "original")
_DATA_IMAGE = re.compile(r"^data:image/(jpeg|jpg|png|gif|webp);base64,", re.IGNORECASE)


def rule_content(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    images = 0
    for i, msg in ctx.index.arrays:
        parts = msg["content"]
        assert isinstance(parts, list)
        if msg["role"] == "tool" and not ctx.profile.vision:
            yield Problem("content_not_string", f"messages[{i}].content",
                          f"{where(i, msg)}: content must be a string for model '{req.model}', got an array "
                          "of content parts. Join the text parts into one string.", "R6")
            continue
        for j, part in enumerate(parts):
            if part["type"] == "text":
                continue
            if part["type"] != "image_url" and part["type"] != "file":
                yield _unknown_part(ctx, i, msg, j, part["type"])
                continue
            images += 1
            yield from _media_part(req, ctx, i, msg, j, part)
    if images > IMAGES_MAX:
        yield Problem("invalid_image", "messages",
                      f"Too many images: {images} in this request, DeepSeek accepts at most "
                      f"{IMAGES_MAX}.", "R9")


def _unknown_part(ctx: ChatContext, i: int, msg: Message, j: int, kind: str) -> Problem:
    """R7: a part type chatgate does not know (a server tool's result passed back may be one): forwarded."""
    return Problem("unknown_content_part", f"messages[{i}].content[{j}].type",
                   f"{where(i, msg)}: content[{j}] has type '{kind}', which chatgate does not know (DeepSeek "
                   "documents text, image_url and file parts); forwarded as sent.", "R7",
                   warning=not ctx.strict)


def _media_part(req: ChatCompletionRequest, ctx: ChatContext, i: int, msg: Message, j: int,
                part: ImageURLPart | FilePart) -> Iterator[Problem]:
    param = f"messages[{i}].content[{j}]"
    if not ctx.profile.vision:
        yield Problem("image_not_supported", param,
                      f"{where(i, msg)}: content[{j}] is an {part['type']} part, but model "
                      f"'{req.model}' does not "
                      "support images or files (This model does not support image). Use a vision model such "
                      "as 'deepseek-flash', or remove the part.", "R8")
        return
    if part["type"] == "image_url":
        yield from _image_url(i, msg, j, part, param)
    else:
        ref: FileRef | FilePart = part.get("file", part)
        if (ref.get("file_id") is None) == (ref.get("file_data") is None):
            inner = ".file" if "file" in part else ""
            yield Problem("invalid_image", f"{param}{inner}",
                          f"{where(i, msg)}: content[{j}]{inner} must have exactly one of 'file_id' or "
                          "'file_data'.", "R9")


def _image_url(i: int, msg: Message, j: int, part: ImageURLPart, param: str) -> Iterator[Problem]:
    url = part["image_url"]["url"]
    if len(url) > IMAGE_URL_MAX and not url.startswith("data:"):
        yield Problem("invalid_image", f"{param}.image_url.url",
                      f"{where(i, msg)}: content[{j}].image_url.url is {len(url)} characters; "
                      f"DeepSeek accepts "
                      f"image URLs of at most {IMAGE_URL_MAX}. Send the image inline as a data: URL.", "R9")
    elif not (url.startswith(("http://", "https://")) or _DATA_IMAGE.match(url)):
        yield Problem("invalid_image", f"{param}.image_url.url",
                      f"{where(i, msg)}: content[{j}].image_url.url must be an http(s) URL or "
                      "'data:image/(jpeg|png|gif|webp);base64,…'.", "R9")
    detail = part["image_url"].get("detail")
    if detail is not None and detail not in IMAGE_DETAILS:
        yield Problem("invalid_image", f"{param}.image_url.detail",
                      f"{where(i, msg)}: content[{j}].image_url.detail '{detail}' is not one of "
                      f"{', '.join(IMAGE_DETAILS)}.", "R9")


# --- assistant messages and tool calls (R10-R12) -------------------------------------


def rule_assistant_not_empty(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    for i, msg in ctx.index.assistants:
        if msg.get("content") is None and not msg.get("tool_calls"):
            yield Problem("assistant_empty", f"messages[{i}]",
                          f"Invalid assistant message: content or tool_calls must be set "
                          f"({where(i, msg)} has "
                          "neither). Send content \"\" or drop the message.", "R10")


def rule_tool_call_shape(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    for i, msg in ctx.index.with_calls:
        for k, call in enumerate(msg.get("tool_calls") or ()):
            call_id = call["id"]
            kind = call.get("type")
            if kind is not None and kind != "function":
                yield Problem("unknown_tool_call_type", f"messages[{i}].tool_calls[{k}].type",
                              f"{where(i, msg)}: tool_calls[{k}] has type '{kind}', which chatgate does not "
                              "know (DeepSeek documents function calls); forwarded as sent (without a "
                              "'function', no tool message is expected for it).", "R11",
                              warning=not ctx.strict)
            elif "function" not in call:  # (a call without one is not paired with tool messages, R14-R16)
                yield Problem("invalid_tool_call", f"messages[{i}].tool_calls[{k}].function",
                              f"Missing required parameter: 'messages[{i}].tool_calls[{k}].function' "
                              f"({where(i, msg)}).", "R11")
            if not call_id:
                # R11: no source shows DeepSeek refusing an empty id (its parser only requires the field).
                yield Problem("invalid_tool_call", f"messages[{i}].tool_calls[{k}].id",
                              f"{where(i, msg)}: tool_calls[{k}].id is empty. Keep the id DeepSeek returned.",
                              "R11", warning=not ctx.strict)
            elif call_id in seen and ctx.strict:
                yield Problem("duplicate_tool_call_id", f"messages[{i}].tool_calls[{k}].id",
                              f"{where(i, msg)}: tool_calls[{k}].id '{call_id}' is already used by "
                              f"messages[{seen[call_id]}]. Tool call ids must be unique in a request.", "R12")
            seen.setdefault(call_id, i)


# --- tool message ordering (R14-R16) -------------------------------------------------


def rule_tool_sequence(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    messages, roles, answers = req.messages, ctx.index.roles, ctx.index.tools
    answered: set[int] = set()  # tool messages inside a block that follows an assistant's tool_calls
    for i, msg in ctx.index.with_calls:
        end = i + 1
        while end < len(roles) and roles[end] == "tool":
            end += 1
        block: range | list[int] = range(i + 1, end)
        if end < len(roles) and roles[end] == "latest_reminder":  # not a turn: read past it (R5)
            while end < len(roles) and roles[end] in _IN_BLOCK:
                end += 1
            block = [t for t in range(i + 1, end) if roles[t] == "tool"]
        answered.update(block)
        ids = [call["id"] for call in msg.get("tool_calls") or () if "function" in call]
        # The usual block answers each call once, in order: nothing to report unless strict (duplicate ids).
        if ctx.strict or [answers[t] for t in block] != ids:
            yield from _tool_block(messages, i, ids, end, ctx, block)
    if len(answered) == len(answers):
        return
    for t in answers:
        if t not in answered:
            tool = messages[t]
            assert tool["role"] == "tool"
            yield _orphan_tool(t, tool, t > 0 and roles[t - 1] == "tool")


def _orphan_tool(i: int, msg: ToolMessage, after_tool: bool) -> Problem:
    hint = ("it follows tool results whose assistant message has no tool_calls" if after_tool
            else "the message before it is not an assistant message with tool_calls")
    return Problem("tool_without_tool_calls", f"messages[{i}].role",
                   f"Messages with role 'tool' must be a response to a preceding message with 'tool_calls': "
                   f"{where(i, msg)} answers tool_call_id '{msg['tool_call_id']}', but {hint}. Put each tool "
                   "result directly after the assistant message whose tool_calls it answers.", "R14")


_IN_BLOCK = ("tool", "latest_reminder")


def _tool_block(messages: list[Message], i: int, ids: list[str], end: int, ctx: ChatContext,
                block: range | list[int]) -> Iterator[Problem]:
    pending = set(ids)
    unknown: list[tuple[int, ToolMessage]] = []
    for t in block:
        tool = messages[t]
        assert tool["role"] == "tool"
        answers = tool["tool_call_id"]
        if answers in pending:
            pending.discard(answers)
        elif answers in ids:
            if ctx.strict:
                yield Problem("duplicate_tool_result", f"messages[{t}].tool_call_id",
                              f"{where(t, tool)}: tool_call_id '{answers}' was already answered. "
                              "Send one tool message per call.", "R15")
        else:
            unknown.append((t, tool))
    # An unknown id alone (every call answered) is an inference (docs/rules-chat.md U6), refused in strict
    # mode only. When a call is left unanswered, both are certain only with too few tool messages: R15 is
    # inferred for DeepSeek (docs/rules-chat.md, R15 and U6) and its R16 check counts them ("insufficient tool
    # messages", R16).
    doubt = len(block) >= len(ids) and not ctx.strict
    if unknown and (pending or ctx.strict):
        for t, tool in unknown:
            yield Problem("unknown_tool_call_id", f"messages[{t}].tool_call_id",
                          f"Invalid parameter: 'tool_call_id' of '{tool['tool_call_id']}' not found in "
                          f"'tool_calls' "
                          f"of previous message ({where(t, tool)}; messages[{i}] has tool_calls with ids "
                          f"{', '.join(repr(x) for x in ids)}). Use the id of the call this result answers."
                          + (_COUNTED if doubt else ""), "R15", warning=doubt)
    if pending:
        # After the block's unknown ids: a result answering an id no call has is what the user must fix
        # (and what DeepSeek names); the call it leaves unanswered follows as a further problem.
        yield _unanswered(messages, i, ids, pending, end, end - 0.5 if unknown else None, doubt)


_COUNTED = (" (Forwarded: there is a tool message for each call, and DeepSeek is only known to count "
            "them.)")


def _unanswered(messages: list[Message], i: int, ids: list[str], pending: set[str], end: int,
                order: float | None = None, doubt: bool = False) -> Problem:
    missing = ", ".join(x for x in ids if x in pending)
    if end < len(messages):
        after = f"{where(end, messages[end])} comes before they are all answered"
    else:
        after = "the conversation ends before they are all answered"
    return Problem("tool_calls_unanswered", f"messages[{i}].tool_calls",
                   "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                   f"each 'tool_call_id'. Missing: {missing} (messages[{i}], role assistant); {after}. Add a "
                   "tool message for each id directly after it, or remove the unanswered calls."
                   + (_COUNTED if doubt else ""), "R16", warning=doubt, order=order)


# --- thinking mode (R17, R34, R36) -----------------------------------------------


def rule_reasoning_content(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R17. Without `tools` (a title or compaction call replaying an agent's history) it is a warning,
    refused in strict mode."""
    if not ctx.thinking or (ctx.profile.legacy_reasoner and ctx.options.legacy_reasoner_rules):
        return
    # DeepSeek requires it "for requests carrying the `tools` parameter" (docs/rules-chat.md, R17 and U3).
    doubt = not req.tools and not ctx.strict
    for i, msg in ctx.index.with_calls:
        if msg.get("reasoning_content") is None:
            fix = ("DeepSeek documents this for requests carrying 'tools' and this one has none, so it may "
                   "pass; to be sure, send back" if doubt else "Send back")
            yield Problem("reasoning_content_missing", f"messages[{i}].reasoning_content",
                          "The `reasoning_content` in the thinking mode must be passed back to the API "
                          f"({where(i, msg)} with tool_calls has none). {fix} the reasoning_content "
                          "DeepSeek returned with this tool call, or set thinking.type = "
                          "\"disabled\".", "R17", warning=doubt)


THINKING_TYPES = ("enabled", "disabled", "adaptive")  # DeepSeek's deserializer lists all three (R36)
REASONING_EFFORTS = ("low", "high", "max", "minimal", "medium", "xhigh", "ultra", "none")


def rule_thinking_params(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if req.thinking is not None and req.thinking.type not in (*THINKING_TYPES, None):
        yield Problem("invalid_thinking", "thinking.type",
                      f"Invalid 'thinking.type': '{req.thinking.type}'. Use \"enabled\", \"disabled\" or "
                      "\"adaptive\".", "R36")
    if req.reasoning_effort is not None and req.reasoning_effort not in REASONING_EFFORTS:
        yield Problem("invalid_thinking", "reasoning_effort",
                      f"Invalid 'reasoning_effort': '{req.reasoning_effort}'. Use one of low, high, max "
                      "(minimal, medium, xhigh, ultra and none are mapped by DeepSeek).", "R36")


def rule_thinking_conflict(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R41: DeepSeek refused thinking disabled together with an effort (Apr-Jun 2026), maybe not since."""
    effort = req.reasoning_effort
    if req.thinking is None or req.thinking.type != "disabled" or effort is None or effort == "none":
        return
    yield Problem("thinking_disabled_with_effort", "reasoning_effort",
                  "thinking options type cannot be disabled when reasoning_effort is set: thinking.type is "
                  f"\"disabled\" and reasoning_effort is '{effort}'. Remove 'reasoning_effort' (it means "
                  "nothing without thinking) or set it to \"none\".", "R41", warning=not ctx.strict)


def rule_tool_choice_thinking(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    forced = req.tool_choice == "required" or (
        req.tool_choice is not None and not isinstance(req.tool_choice, str)
        and req.tool_choice.type == "function" and req.tool_choice.function is not None)
    if ctx.thinking and forced:
        yield Problem("tool_choice_in_thinking", "tool_choice",
                      "Thinking mode does not support this tool_choice: 'required' and a named function are "
                      f"refused while model '{req.model}' thinks. Set thinking.type = \"disabled\" or use "
                      "tool_choice \"auto\".", "R34")


# --- legacy deepseek-reasoner (R18-R20), behind validation.legacy_reasoner_rules ---------


def rule_legacy_reasoner(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if not (ctx.profile.legacy_reasoner and ctx.options.legacy_reasoner_rules):
        return
    for i, msg in enumerate(req.messages):
        if (msg["role"] == "assistant" and msg.get("reasoning_content") is not None
                and not msg.get("prefix")):
            yield Problem("reasoning_content_not_allowed", f"messages[{i}].reasoning_content",
                          "The reasoning_content is an intermediate result for display purposes "
                          "only and will "
                          f"not be included in the context for inference ({where(i, msg)}). Please "
                          f"remove the "
                          "reasoning_content from your message.", "R18")
    yield from _successive_roles(req)
    yield from _reasoner_order(req)


def _successive_roles(req: ChatCompletionRequest) -> Iterator[Problem]:
    turns = [(i, m) for i, m in enumerate(req.messages) if m["role"] != "latest_reminder"]
    for (h, a), (i, b) in pairwise(turns):
        if a["role"] == b["role"] and a["role"] in ("user", "assistant"):
            yield Problem("successive_roles", f"messages[{i}].role",
                          f"deepseek-reasoner does not support successive user or assistant messages "
                          f"(messages[{h}] and messages[{i}] in your input, both role "
                          f"{b['role']}). You should "
                          "interleave the user/assistant messages in the message sequence: merge "
                          "them into one "
                          "message.", "R19")


def _reasoner_order(req: ChatCompletionRequest) -> Iterator[Problem]:
    msgs = req.messages
    first = next((i for i, m in enumerate(msgs) if m["role"] not in ("system", "latest_reminder")), None)
    if first is not None and msgs[first]["role"] != "user":
        yield Problem("reasoner_order", f"messages[{first}].role",
                      "The first message (except the system message) of deepseek-reasoner must be a user "
                      f"message, but an {msgs[first]['role']} message detected "
                      f"({where(first, msgs[first])}). "
                      "Start the conversation with the user's message.", "R20")
    for i, m in enumerate(msgs):
        if m["role"] == "system" and first is not None and i > first:
            yield Problem("reasoner_order", f"messages[{i}].role",
                          "The system message of deepseek-reasoner must be put on the beginning of "
                          "the message "
                          f"sequence ({where(i, m)}). Move it before messages[{first}].", "R20")
    last = msgs[-1] if msgs else None
    if last is not None and not (last["role"] == "user" or (
            last["role"] == "assistant" and last.get("prefix"))):
        yield Problem("reasoner_order", f"messages[{len(msgs) - 1}].role",
                      "The last message of deepseek-reasoner must be a user message, or an assistant message "
                      "with prefix mode on (refer to "
                      "https://api-docs.deepseek.com/guides/chat_prefix_completion); "
                      f"{where(len(msgs) - 1, last)} is last. End with the user's message.", "R20")


# --- prefix completion (R21) ------------------------------------------------------


def rule_prefix(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    last = len(req.messages) - 1
    for i, msg in ctx.index.assistants:
        if not msg.get("prefix"):
            continue
        if i != last:
            yield Problem("invalid_prefix", f"messages[{i}].prefix",
                          f"{where(i, msg)}: prefix is a Beta feature allowed only on the last "
                          f"message, which "
                          "must be the assistant message to continue. Remove 'prefix' here.", "R21")
        elif not ctx.beta:
            yield Problem("invalid_prefix", f"messages[{i}].prefix",
                          f"{where(i, msg)}: prefix completion is a Beta feature: {ctx.beta_hint()}.", "R21")


# --- response format (R23, R24) -------------------------------------------------------


def rule_response_format(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    fmt = req.response_format
    if fmt is None:
        return
    if fmt.type not in ("text", "json_object"):
        yield Problem("unsupported_response_format", "response_format.type",
                      f"This response_format type is unavailable now: '{fmt.type}'. DeepSeek supports "
                      "\"text\" and \"json_object\" (describe the schema in the prompt instead).", "R23")
    elif fmt.type == "json_object" and not any(_mentions_json(m) for m in req.messages):
        yield Problem("json_word_missing", "messages",
                      "Prompt must contain the word 'json' in some form to use 'response_format' of type "
                      "'json_object'. Add e.g. \"Answer in JSON.\" to the system or user message.", "R24")


def _mentions_json(msg: Message) -> bool:
    content = msg.get("content")
    if isinstance(content, str):
        return "json" in content.lower()
    if isinstance(content, list):
        return any(p["type"] == "text" and "json" in p["text"].lower() for p in content)
    return False


# --- sampling and output parameters (R25-R29, R35, R37, R38) ------------------------------


def rule_sampling(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    # In thinking mode DeepSeek ignores these (docs/rules-chat.md, R25); whether it still range-checks them is
    # unknown.
    if not ctx.thinking or ctx.strict:
        yield from in_range("temperature", req.temperature, 0, 2, "R25")
        yield from in_range("top_p", req.top_p, 0, 1, "R25")
    if ctx.strict:  # deprecated and ignored by DeepSeek today (docs/rules-chat.md, R26)
        yield from in_range("frequency_penalty", req.frequency_penalty, -2, 2, "R26")
        yield from in_range("presence_penalty", req.presence_penalty, -2, 2, "R26")


def rule_max_tokens(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    top = ctx.profile.max_tokens_max
    if req.max_tokens is not None and not 1 <= req.max_tokens <= top:
        bound = f"[1, {top}]" if ctx.known else "[1, …]"
        yield Problem("max_tokens_out_of_range", "max_tokens",
                      f"Invalid max_tokens value, the valid range of max_tokens is {bound} for model "
                      f"'{req.model}'; got {req.max_tokens}.", "R27")


STOP_MAX = 16


def rule_stop(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if isinstance(req.stop, list) and len(req.stop) > STOP_MAX:
        yield Problem("too_many_stop_sequences", "stop",
                      f"Invalid 'stop': {len(req.stop)} sequences; DeepSeek accepts up to {STOP_MAX}.", "R28")


def rule_stream_options(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if req.stream_options is not None and req.stream is not True:
        yield Problem("stream_options_without_stream", "stream_options",
                      "stream_options should be set along with stream = true. Set \"stream\": true or remove "
                      "'stream_options'.", "R29")


def rule_logprobs(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    yield from in_range("top_logprobs", req.top_logprobs, 0, 20, "R35")
    if req.top_logprobs is not None and req.logprobs is not True:
        yield Problem("top_logprobs_requires_logprobs", "top_logprobs",
                      "Invalid 'top_logprobs': `logprobs` must be set to true if this parameter is "
                      "used.", "R35")


_USER_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def rule_user_id(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R37: over 512 UTF-8 bytes is refused; other characters than DeepSeek recommends are a warning (its
    rate-limit page only recommends them since 2026-11)."""
    user_id = req.user_id
    if user_id is None:
        return
    size = user_id_too_long(user_id)
    if size is not None:
        yield Problem("invalid_user_id", "user_id",
                      f"Invalid 'user_id': {size} UTF-8 bytes; DeepSeek accepts at most {USER_ID_MAX_BYTES}. "
                      "Send a shorter id (a hash of it, for example).", "R37")
    elif not _USER_ID.match(user_id):
        yield Problem("invalid_user_id", "user_id",
                      "'user_id' has characters other than the letters, digits, '_' and '-' DeepSeek "
                      "recommends (or is empty); forwarded, DeepSeek accepts up to 512 UTF-8 bytes.", "R37",
                      warning=not ctx.strict)


def rule_safety_check(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R42: `safety_check.level` is high or low (guides/safety, 2026-11)."""
    check = req.safety_check
    if check is not None and check.level is not None and check.level not in SAFETY_LEVELS:
        yield Problem("invalid_safety_check", "safety_check.level",
                      safety_level_message("safety_check.level", check.level), "R42")


def rule_n(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    if req.n is not None and req.n != 1:
        yield Problem("n_not_supported", "n",
                      f"DeepSeek supports only n = 1; got n = {req.n}. Remove 'n'.", "R38")


# --- tools (R30-R33) -----------------------------------------------------------------

TOOLS_MAX = 128
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def rule_tools(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    tools = req.tools or []
    if len(tools) > TOOLS_MAX:
        yield Problem("too_many_tools", "tools",
                      f"Invalid 'tools': {len(tools)} functions; DeepSeek accepts a max of "
                      f"{TOOLS_MAX}.", "R30")
    names: dict[str, int] = {}
    for k, tool in enumerate(tools):
        function = tool.get("function")
        if tool["type"] != "function":
            yield from _other_tool(req, ctx, k, tool["type"])
            continue
        if function is None:
            yield Problem("missing_required_parameter", f"tools[{k}].function",
                          f"Missing required parameter: 'tools[{k}].function' (a function tool is "
                          "{\"type\": \"function\", \"function\": {\"name\": …, \"parameters\": {…}}}).",
                          "R30")
            continue
        name = function["name"]
        if not _FUNCTION_NAME.match(name):
            yield Problem("invalid_function_name", f"tools[{k}].function.name",
                          f"Invalid 'tools[{k}].function.name': string does not match pattern. "
                          f"Expected a string "
                          f"that matches the pattern '^[a-zA-Z0-9_-]+$' (at most 64 characters); "
                          f"got {name!r}. "
                          "Replace '.', ':', spaces and non-ASCII characters with '_'.", "R31")
        elif name in names and ctx.strict:
            yield Problem("invalid_function_name", f"tools[{k}].function.name",
                          f"Invalid 'tools[{k}].function.name': '{name}' is already defined by "
                          f"tools[{names[name]}].",
                          "R31")
        names.setdefault(name, k)


def _other_tool(req: ChatCompletionRequest, ctx: ChatContext, k: int, kind: str) -> Iterator[Problem]:
    """R30: DeepSeek's server tools are valid (a warning off deepseek-flash); an unknown type is forwarded."""
    if kind in SERVER_TOOLS:
        note = server_tool_model_note(kind, req.model, ctx.profile.name)
        if note is not None:
            yield Problem("server_tool_model", f"tools[{k}].type", note, "R30", warning=not ctx.strict)
        return
    yield Problem("unknown_tool_type", f"tools[{k}].type",
                  f"tools[{k}] has type '{kind}', which chatgate does not know (DeepSeek documents function "
                  "tools and its server tools deepseek_web_search and deepseek_read_url); forwarded as sent.",
                  "R30", warning=not ctx.strict)


def rule_strict_tools(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    """R32: strict schemas are a Beta feature. Off /beta DeepSeek accepts `strict: true` and does not enforce
    it (docs/rules-chat.md U11): openai-agents and pydantic-ai send it on every tool, so it is forwarded with
    a warning."""
    strict = [k for k, tool in enumerate(req.tools or ()) if tool.get("function", _NO_FUNCTION).get("strict")]
    if not strict:
        return
    if not ctx.beta:
        if ctx.strict:
            for k in strict:
                yield Problem("strict_requires_beta", f"tools[{k}].function.strict",
                              f"tools[{k}].function.strict is a Beta feature: {ctx.beta_hint()}, or remove "
                              "'strict'.", "R32")
            return
        names = ", ".join(f"tools[{k}]" for k in strict[:3]) + (" …" if len(strict) > 3 else "")
        yield Problem("strict_not_enforced", f"tools[{strict[0]}].function.strict",
                      f"strict: true ({names}) is only enforced on DeepSeek's /beta; on this route it is "
                      f"accepted and ignored. For strict schemas, {ctx.beta_hint()}.", "R32", warning=True)
        return
    for k in strict:
        function = (req.tools or [])[k].get("function", _NO_FUNCTION)
        for path, why in strict_schema_problems(function.get("parameters") or {}, "parameters"):
            yield Problem("invalid_parameters_schema", f"tools[{k}].function.{path}",
                          f"tools[{k}].function.{path}: {why} (strict mode).", "R32")


_NO_FUNCTION: dict[str, Any] = {}
STRICT_UNSUPPORTED = ("minLength", "maxLength", "minItems", "maxItems")


def strict_schema_problems(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    """DOC-tools: every object lists all properties in `required` and sets additionalProperties false."""
    if not isinstance(schema, dict):
        return
    for key in STRICT_UNSUPPORTED:
        if key in schema:
            yield path, f"'{key}' is not supported in strict mode"
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            props = {}
        listed = schema.get("required")
        # arbitrary client JSON: only string entries of a list count (never hash a dict/list)
        required = {x for x in listed if isinstance(x, str)} if isinstance(listed, list) else set()
        missing = [name for name in props if name not in required]
        if missing:
            yield path, f"every property must be listed in 'required' (missing: {', '.join(missing)})"
        if schema.get("additionalProperties") is not False:
            yield path, "'additionalProperties' must be false"
        for name, sub in props.items():
            yield from strict_schema_problems(sub, f"{path}.properties.{name}")
    for key in ("items", "$defs", "$def", "definitions", "anyOf"):
        sub = schema.get(key)
        if isinstance(sub, list):
            for n, item in enumerate(sub):
                yield from strict_schema_problems(item, f"{path}.{key}[{n}]")
        elif isinstance(sub, dict) and key == "items":
            yield from strict_schema_problems(sub, f"{path}.items")
        elif isinstance(sub, dict):
            for name, item in sub.items():
                yield from strict_schema_problems(item, f"{path}.{key}.{name}")


TOOL_CHOICES = ("none", "auto", "required")


def rule_tool_choice(req: ChatCompletionRequest, ctx: ChatContext) -> Iterator[Problem]:
    choice = req.tool_choice
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            yield Problem("invalid_tool_choice", "tool_choice",
                          f"tool_choice: expected one of `none`, `auto`, `required` or a tool; got '{choice}'"
                          + (" ('any' is Anthropic's spelling of "
                             "'required')." if choice == "any" else "."), "R33")
        elif choice != "none" and not req.tools and ctx.strict:
            yield Problem("invalid_tool_choice", "tool_choice",
                          f"tool_choice '{choice}' needs 'tools'; none are defined.", "R33")
        return
    if choice.type != "function":
        # a server tool's type, or one chatgate does not know: DeepSeek documents neither (forwarded)
        yield Problem("invalid_tool_choice", "tool_choice.type",
                      f"tool_choice of type '{choice.type}' is not documented by DeepSeek (none, auto, "
                      "required or {\"type\": \"function\", \"function\": {\"name\": …}}); forwarded as "
                      "sent.", "R33", warning=not ctx.strict)
    elif choice.function is None:
        yield Problem("missing_required_parameter", "tool_choice.function",
                      "Missing required parameter: 'tool_choice.function' (a named function is "
                      "{\"type\": \"function\", \"function\": {\"name\": …}}).", "R33")
    elif ctx.strict and choice.function.name not in {
            t["function"]["name"] for t in req.tools or () if "function" in t}:
        yield Problem("invalid_tool_choice", "tool_choice.function.name",
                      f"tool_choice names function '{choice.function.name}', which is not in 'tools'.", "R33")


RULES: tuple[Rule[ChatCompletionRequest, ChatContext], ...] = (
    rule_model_known,
    rule_messages_not_empty,
    rule_roles,
    rule_content,
    rule_assistant_not_empty,
    rule_tool_call_shape,
    rule_tool_sequence,
    rule_reasoning_content,
    rule_legacy_reasoner,
    rule_prefix,
    rule_response_format,
    rule_thinking_params,
    rule_thinking_conflict,
    rule_tool_choice_thinking,
    rule_sampling,
    rule_max_tokens,
    rule_stop,
    rule_stream_options,
    rule_logprobs,
    rule_user_id,
    rule_safety_check,
    rule_n,
    rule_tools,
    rule_strict_tools,
    rule_tool_choice,
)
