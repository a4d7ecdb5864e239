"""What api.deepseek.com refuses on its Anthropic-format route (`POST /anthropic/v1/messages`), for the fake.

Written from docs/rules-anthropic.md (A1-A24, with their sources) and docs/rules-chat.md
(docs/rules-chat.md#models), never from the product: `anthropic_error(body, size)` gives DeepSeek's 400
message for a parsed JSON object, or None if DeepSeek would accept it. Only the rules the spec holds certain
or likely are enforced; where DeepSeek's behaviour is unknown or not enforced any more (A5, A8, A14, A15, A17,
A21, A22) the body is accepted: the fake must accept everything DeepSeek may accept. Unknown top-level fields
are accepted (A23).

Order: the serde deserializer first (types, enums, missing fields: "Failed to deserialize the JSON body into
the target type: …"), then the semantic rules, with the texts DeepSeek is quoted with. Every 400 goes out in
DeepSeek's OpenAI-style envelope (docs/rules-anthropic.md#deepseeks-answers-on-this-route), not Anthropic's.
"""

from __future__ import annotations

from typing import Any

from chatgate.demo.rules import SAFETY_LEVELS, USER_ID_MAX_BYTES, USER_ID_TOO_LONG, Deserializer, Refused

# latest_reminder: documented since 2026-11 directly before its user message (guides/latest_reminder); the
# fake accepts it anywhere and reads the tool pairing past it (where DeepSeek checks it is not known).
ROLES = ("user", "assistant", "latest_reminder")
# A4 + A5: the supported blocks, then the documented "Not Supported" ones, which are accepted (A5: whether
# DeepSeek drops or refuses them is not known). The list in the refusal text is the fake's own.
BLOCK_TYPES = (
    "text", "image", "thinking", "tool_use", "tool_result", "server_tool_use", "web_search_tool_result",
    "document", "search_result", "redacted_thinking", "code_execution_tool_result", "mcp_tool_use",
    "mcp_tool_result", "container_upload",
)  # fmt: skip
RESULT_BLOCK_TYPES = ("text", "image", "document", "search_result")  # inside tool_result.content
THINKING_TYPES = ("adaptive", "enabled", "disabled")
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
FORCED_CHOICES = ("tool", "any")
MAX_TOKENS = 393_216  # 384K, V4 / V4.1 (docs/rules-chat.md#models); same ceiling on this route [I]

# The model names DeepSeek serves under their own name on this route (docs/rules-chat.md#models: the current
# two, plus the legacy flash names still accepted since 2026-09-10). deepseek-chat / deepseek-reasoner are
# retired.
DEEPSEEK_MODELS = ("deepseek-flash", "deepseek-v4-pro", "deepseek-v4-flash", "deepseek-v4-flash-vision-exp")
FLASH, PRO = "deepseek-flash", "deepseek-v4-pro"
ONE_M = "[1m]"

MAX_RANGE = f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_TOKENS}]"
# A20: DeepSeek's wording is unknown; modelled on its max_tokens text.
TEMPERATURE_RANGE = "Invalid temperature value, the valid range of temperature is [0, 2]"
TOP_P_RANGE = "Invalid top_p value, the valid range of top_p is [0, 1]"
EMPTY_CONTENT = "messages.{index}: all messages must have non-empty content"
UNANSWERED_TOOL_USE = (
    "messages.{index}:`tool_use` ids were found without `tool_result` blocks immediately after: {ids}. "
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
)
THINKING_MISSING = "The `content[].thinking` in the thinking mode must be passed back to the API."
DISABLED_WITH_EFFORT = "thinking options type cannot be disabled when reasoning_effort is set"
THINKING_TOOL_CHOICE = "Thinking mode does not support this tool_choice"


def unknown_model(model: str) -> str:
    """A18 on the newer doc; the exact text on this route is unknown: the Responses route's
    (docs/rules-responses.md, P2)."""
    return f"The supported API model names are {FLASH}, {PRO}, but you passed {model}."


def anthropic_error(body: Any, size: int = 0) -> str | None:
    """DeepSeek's 400 message for this Messages body, or None. `size` (the body length) stands in for the
    column of deserializer messages."""
    try:
        MessagesDeserializer(f"at line 1 column {max(size, 1)}").body(body)
        semantics(body)
    except Refused as refused:
        return str(refused)
    return None


# --------------------------------------------------------------------------------------- model, thinking


def served_model(model: Any) -> str | None:
    """The model DeepSeek answers with for this `model`, or None if it refuses the name (A18, A19).

    `claude*` names are always accepted: opus ones go to v4-pro, the rest to flash (DOC-anth, newer text).
    DeepSeek names answer under their own name; a literal `[1m]` suffix on one was served by flash
    (docs/rules-anthropic.md, A19)."""
    if not isinstance(model, str):
        return None
    if model.lower().startswith("claude"):
        return PRO if "opus" in model.lower() else FLASH
    if model in DEEPSEEK_MODELS:
        return model
    if model.endswith(ONE_M) and model[: -len(ONE_M)] in DEEPSEEK_MODELS:
        return FLASH
    return None


def is_thinking(body: dict[str, Any]) -> bool:
    """Thinking is on unless `thinking.type` is `disabled` (absent, enabled, adaptive: on)."""
    thinking = body.get("thinking")
    return not (isinstance(thinking, dict) and thinking.get("type") == "disabled")


def blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks of a message (a string content has none)."""
    content = message.get("content") if isinstance(message, dict) else None
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


# --------------------------------------------------------------------------------------- deserializer


def expected(allowed: tuple[str, ...]) -> str:
    """serde's list of variants: "`a`", "`a` or `b`", "one of `a`, `b`, `c`"."""
    names = [f"`{name}`" for name in allowed]
    if len(names) == 1:
        return names[0]
    if len(names) == 2:
        return f"{names[0]} or {names[1]}"
    return "one of " + ", ".join(names)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MessagesDeserializer(Deserializer):
    """Type and enum checks of a Messages body, in the order the fields appear; raises Refused.

    Block-level problems are reported at `messages[i].content` without the block index, as DeepSeek does
    (docs/rules-anthropic.md, A4: `messages[66].content: unknown variant `image`, expected one of …`)."""

    def variant(self, path: str, value: Any, allowed: tuple[str, ...]) -> None:
        if not isinstance(value, str):
            raise self.wrong(path, value, "variant identifier")
        if value not in allowed:
            raise self.fail(path, f"unknown variant `{value}`, expected {expected(allowed)}")

    def optional_map(self, path: str, value: Any, expected_type: str) -> dict[str, Any] | None:
        return None if value is None else self.mapping(path, value, expected_type)

    def number(self, path: str, value: Any) -> None:
        if value is not None and not is_number(value):
            raise self.wrong(path, value, "f32")

    def body(self, body: Any) -> None:
        top = self.mapping("", body)
        for name, value in top.items():
            check = FIELD_CHECKS.get(name)
            if check is not None:
                check(self, value)
        for name in ("model", "messages", "max_tokens"):  # A1, A2: required
            if name not in top:
                raise self.missing("", name)

    def model(self, value: Any) -> None:
        self.string("model", value)

    def max_tokens(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.wrong("max_tokens", value, "u32")

    def messages(self, value: Any) -> None:
        for i, message in enumerate(self.sequence("messages", value)):
            self.message(f"messages[{i}]", message)

    def message(self, path: str, value: Any) -> None:
        message = self.mapping(path, value, "struct Message")
        if "role" not in message:
            raise self.missing(path, "role")
        self.variant(f"{path}.role", message["role"], ROLES)  # A3
        if "content" not in message:
            raise self.missing(path, "content")
        content = message["content"]
        if isinstance(content, str):
            return
        if not isinstance(content, list):
            raise self.wrong(f"{path}.content", content, "a string or a sequence of content blocks")
        for block in content:
            self.block(f"{path}.content", block)

    def block(self, path: str, value: Any) -> None:
        block = self.mapping(path, value, "internally tagged enum ContentBlock")
        if "type" not in block:
            raise self.missing(path, "type")
        kind = block["type"]
        self.variant(path, kind, BLOCK_TYPES)  # A4
        for name in REQUIRED_BLOCK_FIELDS.get(kind, ()):
            if name not in block:
                raise self.missing(path, name)  # A9 for thinking
            self.string(f"{path}.{name}", block[name])
        if kind == "tool_result":
            self.tool_result_content(path, block.get("content"))

    def tool_result_content(self, path: str, content: Any) -> None:
        if content is None or isinstance(content, str):
            return
        if not isinstance(content, list):
            raise self.wrong(path, content, "a string or a sequence of content blocks")
        for raw in content:
            inner = self.mapping(path, raw, "internally tagged enum ToolResultContent")
            if "type" not in inner:
                raise self.missing(path, "type")
            self.variant(path, inner["type"], RESULT_BLOCK_TYPES)
            if inner["type"] == "text":
                if "text" not in inner:
                    raise self.missing(path, "text")
                self.string(f"{path}.text", inner["text"])

    def system(self, value: Any) -> None:
        if value is not None and not isinstance(value, (str, list)):
            raise self.wrong("system", value, "a string or a sequence of text blocks")

    def thinking(self, value: Any) -> None:
        thinking = self.optional_map("thinking", value, "internally tagged enum Thinking")
        if thinking is None:
            return
        if "type" not in thinking:
            raise self.missing("thinking", "type")
        self.variant("thinking.type", thinking["type"], THINKING_TYPES)  # A11

    def tool_choice(self, value: Any) -> None:
        choice = self.optional_map("tool_choice", value, "internally tagged enum ToolChoice")
        if choice is None:
            return
        if "type" not in choice:
            raise self.missing("tool_choice", "type")
        self.variant("tool_choice", choice["type"], TOOL_CHOICE_TYPES)
        if choice["type"] == "tool":
            if "name" not in choice:
                raise self.missing("tool_choice", "name")
            self.string("tool_choice.name", choice["name"])

    def tools(self, value: Any) -> None:
        if value is None:
            return
        for k, raw in enumerate(self.sequence("tools", value)):
            tool = self.mapping(f"tools[{k}]", raw, "struct Tool")
            if tool.get("type") in (None, "custom"):  # server tools (A17) are not checked
                if "name" not in tool:
                    raise self.missing(f"tools[{k}]", "name")
                self.string(f"tools[{k}].name", tool["name"])

    def stream(self, value: Any) -> None:
        self.boolean("stream", value)

    def temperature(self, value: Any) -> None:
        self.number("temperature", value)

    def top_p(self, value: Any) -> None:
        self.number("top_p", value)

    def metadata(self, value: Any) -> None:
        metadata = self.optional_map("metadata", value, "struct Metadata")
        if metadata is not None:  # any string: the A15 pattern was enforced for one day only (A15)
            self.string("metadata.user_id", metadata.get("user_id"), nullable=True)

    def safety_check(self, value: Any) -> None:
        check = self.optional_map("safety_check", value, "struct SafetyCheck")
        if check is not None and check.get("level") is not None:
            self.variant("safety_check.level", check["level"], SAFETY_LEVELS)  # 2026-11

    def output_config(self, value: Any) -> None:
        self.optional_map("output_config", value, "struct OutputConfig")  # any effort value (A14)

    def stop_sequences(self, value: Any) -> None:
        if value is not None:
            for k, item in enumerate(self.sequence("stop_sequences", value)):
                self.string(f"stop_sequences[{k}]", item)


REQUIRED_BLOCK_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "thinking": ("thinking",),  # A9; `signature` is optional and never checked (A10)
    "tool_use": ("id", "name"),
    "tool_result": ("tool_use_id",),
}

FIELD_CHECKS = {
    "model": MessagesDeserializer.model,
    "max_tokens": MessagesDeserializer.max_tokens,
    "messages": MessagesDeserializer.messages,
    "system": MessagesDeserializer.system,
    "thinking": MessagesDeserializer.thinking,
    "tool_choice": MessagesDeserializer.tool_choice,
    "tools": MessagesDeserializer.tools,
    "stream": MessagesDeserializer.stream,
    "temperature": MessagesDeserializer.temperature,
    "top_p": MessagesDeserializer.top_p,
    "metadata": MessagesDeserializer.metadata,
    "output_config": MessagesDeserializer.output_config,
    "stop_sequences": MessagesDeserializer.stop_sequences,
    "safety_check": MessagesDeserializer.safety_check,
}


# --------------------------------------------------------------------------------------- semantics


def semantics(body: dict[str, Any]) -> None:
    """The rules after deserialization; the body is known to have the right types here."""
    if not 1 <= body["max_tokens"] <= MAX_TOKENS:
        raise Refused(MAX_RANGE)  # A2
    if served_model(body["model"]) is None:
        raise Refused(unknown_model(body["model"]))  # A18 (newer doc)
    user_id = (body.get("metadata") or {}).get("user_id")
    if isinstance(user_id, str) and len(user_id.encode("utf-8", "surrogatepass")) > USER_ID_MAX_BYTES:
        raise Refused(USER_ID_TOO_LONG)  # A15, 2026-11: the length, not the characters
    temperature, top_p = body.get("temperature"), body.get("top_p")
    if temperature is not None and not 0 <= temperature <= 2:
        raise Refused(TEMPERATURE_RANGE)  # A20
    if top_p is not None and not 0 <= top_p <= 1:
        raise Refused(TOP_P_RANGE)  # A20
    thinking = is_thinking(body)
    effort = (body.get("output_config") or {}).get("effort")
    if not thinking and effort not in (None, "none"):
        raise Refused(DISABLED_WITH_EFFORT)  # A12 (top-level reasoning_effort is accepted here, A12)
    choice = body.get("tool_choice") or {}
    if thinking and choice.get("type") in FORCED_CHOICES:
        raise Refused(THINKING_TOOL_CHOICE)  # A13
    messages: list[dict[str, Any]] = body["messages"]
    check_empty_assistants(messages)
    check_tool_results(messages)
    if thinking:
        check_thinking_passed_back(messages)


def check_empty_assistants(messages: list[dict[str, Any]]) -> None:
    """A6: an assistant turn with `content: []` (an empty string is not known to be refused)."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message["content"] == []:
            raise Refused(EMPTY_CONTENT.format(index=index))


def check_tool_results(messages: list[dict[str, Any]]) -> None:
    """A7: every tool_use id of assistant i is answered by a tool_result in message i+1 (one user message).
    A tool_result answering no tool_use (A8) is accepted."""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        ids = [block["id"] for block in blocks(message) if block.get("type") == "tool_use"]
        if not ids:
            continue
        after = index + 1
        while after < len(messages) and messages[after]["role"] == "latest_reminder":
            after += 1
        following = messages[after] if after < len(messages) else None
        answered = set()
        if following is not None and following["role"] == "user":
            answered = {b["tool_use_id"] for b in blocks(following) if b.get("type") == "tool_result"}
        missing = [tool_id for tool_id in ids if tool_id not in answered]
        if missing:
            raise Refused(UNANSWERED_TOOL_USE.format(index=index, ids=", ".join(missing)))


def check_thinking_passed_back(messages: list[dict[str, Any]]) -> None:
    """A10: with thinking on, each assistant turn carrying tool_use has a thinking block (an empty one is
    enough, A10); plain-text turns need none."""
    for message in messages:
        kinds = {block.get("type") for block in blocks(message)}
        if message["role"] == "assistant" and "tool_use" in kinds and "thinking" not in kinds:
            raise Refused(THINKING_MISSING)
