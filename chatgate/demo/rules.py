"""What api.deepseek.com refuses in a chat-completions body, for the fake DeepSeek.

Written from DeepSeek's documented and observed behaviour (docs/rules-chat.md and its sources), never
from the product: `deepseek_error(path, body)` gives DeepSeek's 400 message for a parsed JSON object, or None
if DeepSeek would accept it. Where the spec is unsure whether DeepSeek refuses something, it is accepted:
the fake must accept everything DeepSeek accepts. Unknown top-level fields are accepted (R39).

Checks run in DeepSeek's order: the deserializer first (field types, enums: "Failed to deserialize the JSON
body into the target type: …"), then the semantic rules with the texts DeepSeek is quoted with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from chatgate.demo.server_tools import SERVER_TOOLS

DESERIALIZE = "Failed to deserialize the JSON body into the target type:"
ROLES = ("system", "user", "assistant", "tool", "latest_reminder")
THINKING_TYPES = ("adaptive", "enabled", "disabled")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object")
MODEL_NOT_EXIST = "Model Not Exist"  # R3 (observed)
MAX_TOKENS = 393_216  # 384K: V4 / V4.1 and the legacy names routed to them (docs/rules-chat.md#models)
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
BETA_PATHS = frozenset({"/beta/chat/completions"})
STRICT_UNSUPPORTED = ("minLength", "maxLength", "minItems", "maxItems")
SAFETY_LEVELS = ("high", "low")  # guides/safety (2026-11): any other value is a 400
USER_ID_MAX_BYTES = 512  # the rate-limit page (2026-11); the character set is only recommended
USER_ID_TOO_LONG = "Invalid 'user_id': at most 512 UTF-8 bytes"  # the fake's words: DeepSeek's are unknown

TOOL_WITHOUT_CALLS = "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
CALLS_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
    "'tool_call_id'. (insufficient tool messages following tool_calls message)"
)
REASONING_MISSING = "The `reasoning_content` in the thinking mode must be passed back to the API."
THINKING_TOOL_CHOICE = "Thinking mode does not support this tool_choice"
DISABLED_WITH_EFFORT = "thinking options type cannot be disabled when reasoning_effort is set"
STREAM_OPTIONS = "stream_options should be set along with stream = true"
ASSISTANT_EMPTY = "Invalid assistant message: content or tool_calls must be set"
RESPONSE_FORMAT = "This response_format type is unavailable now"
ONLY_N_1 = "currently, the deepseek api only support n = 1"


class Refused(Exception):
    """DeepSeek's 400 message for the body."""


def deepseek_error(path: str, body: Any, size: int = 0) -> str | None:
    """DeepSeek's 400 message for this chat body sent to `path`, or None. `size` (the body length) stands
    in for the column of deserializer messages."""
    try:
        Deserializer(f"at line 1 column {max(size, 1)}").body(body)
        semantics(path, body)
    except Refused as refused:
        return str(refused)
    return None


# --------------------------------------------------------------------------------------- deserializer


def kind(value: Any) -> str:
    """serde's name for a JSON value in "invalid type" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


class Deserializer:
    """Type and enum checks, in the order the fields appear; raises Refused."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, problem: str) -> Refused:
        prefix = f"{path}: " if path else ""
        return Refused(f"{DESERIALIZE} {prefix}{problem} {self.where}")

    def wrong(self, path: str, value: Any, expected: str) -> Refused:
        return self.fail(path, f"invalid type: {kind(value)}, expected {expected}")

    def missing(self, path: str, name: str) -> Refused:
        return self.fail(path, f"missing field `{name}`")

    def string(self, path: str, value: Any, nullable: bool = False) -> None:
        if not isinstance(value, str) and not (nullable and value is None):
            raise self.wrong(path, value, "a string")

    def mapping(self, path: str, value: Any, expected: str = "a map") -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.wrong(path, value, expected)
        return value

    def sequence(self, path: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.wrong(path, value, "a sequence")
        return value

    def boolean(self, path: str, value: Any) -> None:
        if value is not None and not isinstance(value, bool):
            raise self.wrong(path, value, "a boolean")

    def variant(self, path: str, value: Any, allowed: tuple[str, ...]) -> None:
        if not isinstance(value, str):
            raise self.wrong(path, value, "variant identifier")
        if value not in allowed:
            names = ", ".join(f"`{name}`" for name in allowed)
            raise self.fail(path, f"unknown variant `{value}`, expected one of {names}")

    def body(self, body: Any) -> None:
        top = self.mapping("", body)
        for name, value in top.items():
            check = FIELD_CHECKS.get(name)
            if check is not None:
                check(self, value)
        for name in ("messages", "model"):
            if name not in top:
                raise self.missing("", name)

    def model(self, value: Any) -> None:
        self.string("model", value)

    def messages(self, value: Any) -> None:
        for i, message in enumerate(self.sequence("messages", value)):
            self.message(f"messages[{i}]", message)

    def message(self, path: str, value: Any) -> None:
        message = self.mapping(path, value, "internally tagged enum")
        if "role" not in message:
            raise self.missing(path, "role")
        role = message["role"]
        self.variant(f"{path}.role", role, ROLES)
        if role in ("system", "user", "tool") and "content" not in message:
            raise self.missing(path, "content")
        content = message.get("content")
        if role == "system":
            self.string(f"{path}.content", content)
        elif role == "assistant":
            self.string(f"{path}.content", content, nullable=True)
            self.string(f"{path}.reasoning_content", message.get("reasoning_content"), nullable=True)
            self.tool_calls(f"{path}.tool_calls", message.get("tool_calls"))
        elif role == "user" and not isinstance(content, (str, list)):
            raise self.wrong(f"{path}.content", content, "a string or a sequence of content parts")
        elif role == "tool":
            if "tool_call_id" not in message:
                raise self.missing(path, "tool_call_id")
            self.string(f"{path}.tool_call_id", message["tool_call_id"])

    def tool_calls(self, path: str, value: Any) -> None:
        if value is None:
            return
        for k, raw in enumerate(self.sequence(path, value)):
            call = self.mapping(f"{path}[{k}]", raw, "struct ToolCall")
            for name in ("id", "function"):
                if name not in call:
                    raise self.missing(f"{path}[{k}]", name)
            self.string(f"{path}[{k}].id", call["id"])
            if call.get("type") is not None:  # absent or null: not known to be refused
                self.variant(f"{path}[{k}].type", call["type"], ("function",))
            function = self.mapping(f"{path}[{k}].function", call["function"], "struct Function")
            if "name" not in function:
                raise self.missing(f"{path}[{k}].function", "name")
            self.string(f"{path}[{k}].function.name", function["name"])
            if "arguments" in function:
                self.string(f"{path}[{k}].function.arguments", function["arguments"])

    def thinking(self, value: Any) -> None:
        if value is None:
            return
        thinking = self.mapping("thinking", value, "struct Thinking")
        if "type" not in thinking:
            raise self.missing("thinking", "type")
        self.variant("thinking.type", thinking["type"], THINKING_TYPES)

    def reasoning_effort(self, value: Any) -> None:
        self.string("reasoning_effort", value, nullable=True)

    def max_tokens(self, value: Any) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.wrong("max_tokens", value, "u32")

    def stream(self, value: Any) -> None:
        self.boolean("stream", value)

    def stream_options(self, value: Any) -> None:
        if value is not None:
            options = self.mapping("stream_options", value, "struct StreamOptions")
            self.boolean("stream_options.include_usage", options.get("include_usage"))

    def tools(self, value: Any) -> None:
        if value is None:
            return
        for k, raw in enumerate(self.sequence("tools", value)):
            tool = self.mapping(f"tools[{k}]", raw, "struct Tool")
            if tool.get("type") is not None:
                self.variant(f"tools[{k}].type", tool["type"], ("function", *SERVER_TOOLS))
            if tool.get("type") in SERVER_TOOLS:  # DeepSeek's server web tools have no function (§13.1)
                continue
            if "function" not in tool:
                raise self.missing(f"tools[{k}]", "function")
            function = self.mapping(f"tools[{k}].function", tool["function"], "struct FunctionObject")
            if "name" not in function:
                raise self.missing(f"tools[{k}].function", "name")
            self.string(f"tools[{k}].function.name", function["name"])
            self.boolean(f"tools[{k}].function.strict", function.get("strict"))

    def tool_choice(self, value: Any) -> None:
        if isinstance(value, str) and value not in TOOL_CHOICES:
            raise self.fail("tool_choice", "expected one of `none`, `auto`, `required` or a tool")
        if value is not None and not isinstance(value, str):
            choice = self.mapping("tool_choice", value, "one of `none`, `auto`, `required` or a tool")
            if choice.get("type") in SERVER_TOOLS:  # not documented: accepted (DeepSeek may)
                return
            function = self.mapping("tool_choice.function", choice.get("function"), "struct Function")
            if "name" not in function:
                raise self.missing("tool_choice.function", "name")
            self.string("tool_choice.function.name", function["name"])

    def response_format(self, value: Any) -> None:
        if value is not None:
            self.mapping("response_format", value, "struct ResponseFormat")

    def safety_check(self, value: Any) -> None:
        if value is None:
            return
        check = self.mapping("safety_check", value, "struct SafetyCheck")
        level = check.get("level")
        if level is None:
            return
        if not isinstance(level, str):
            raise self.wrong("safety_check.level", level, "variant identifier")
        if level not in SAFETY_LEVELS:
            raise self.fail("safety_check.level", f"unknown variant `{level}`, expected `high` or `low`")

    def user_id(self, value: Any) -> None:
        self.string("user_id", value, nullable=True)


FIELD_CHECKS = {
    "model": Deserializer.model,
    "messages": Deserializer.messages,
    "thinking": Deserializer.thinking,
    "reasoning_effort": Deserializer.reasoning_effort,
    "max_tokens": Deserializer.max_tokens,
    "stream": Deserializer.stream,
    "stream_options": Deserializer.stream_options,
    "tools": Deserializer.tools,
    "tool_choice": Deserializer.tool_choice,
    "response_format": Deserializer.response_format,
    "safety_check": Deserializer.safety_check,
    "user_id": Deserializer.user_id,
}


# --------------------------------------------------------------------------------------- semantics


def is_thinking(body: dict[str, Any]) -> bool:
    """Thinking mode (docs/rules-chat.md): every model but `deepseek-chat`, unless thinking.type is disabled
    or effort is none."""
    thinking = body.get("thinking")
    disabled = isinstance(thinking, dict) and thinking.get("type") == "disabled"
    return body.get("model") != "deepseek-chat" and not disabled and body.get("reasoning_effort") != "none"


def model_served(body: dict[str, Any]) -> None:
    """R3 / F3: a model DeepSeek does not serve. The stand-in serves every `deepseek-` name (a model DeepSeek
    adds later, which chatgate forwards when told of it: validation.extra_models) and refuses the others
    (`gpt-4o`) in DeepSeek's words."""
    model = body.get("model")
    if isinstance(model, str) and not model.startswith("deepseek-"):
        raise Refused(MODEL_NOT_EXIST)


def semantics(path: str, body: dict[str, Any]) -> None:
    """The rules after deserialization; the body is known to have the right types here."""
    model_served(body)
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise Refused(STREAM_OPTIONS)  # R29
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise Refused(f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_TOKENS}]")  # R27
    if body.get("n") not in (None, 1):
        raise Refused(ONLY_N_1)  # R38 (observed, DeepSeek-V2 #55)
    thinking = body.get("thinking") or {}
    effort = body.get("reasoning_effort")
    if thinking.get("type") == "disabled" and effort not in (None, "none"):
        raise Refused(DISABLED_WITH_EFFORT)  # R41
    user_id = body.get("user_id")
    if isinstance(user_id, str) and len(user_id.encode("utf-8", "surrogatepass")) > USER_ID_MAX_BYTES:
        raise Refused(USER_ID_TOO_LONG)  # R37 (2026-11)
    response_format = body.get("response_format") or {}
    if response_format.get("type", "text") not in RESPONSE_FORMATS:
        raise Refused(RESPONSE_FORMAT)  # R23
    messages: list[dict[str, Any]] = body["messages"]
    check_assistants(messages, is_thinking(body))
    check_tool_order(messages)
    check_tools(path, body.get("tools") or [])
    choice = body.get("tool_choice")
    if is_thinking(body) and (choice == "required" or isinstance(choice, dict)):
        raise Refused(THINKING_TOOL_CHOICE)  # R34


def check_assistants(messages: list[dict[str, Any]], thinking: bool) -> None:
    for message in messages:
        if message["role"] != "assistant":
            continue
        calls = message.get("tool_calls")
        if message.get("content") is None and not calls:
            raise Refused(ASSISTANT_EMPTY)  # R10
        if thinking and calls and not isinstance(message.get("reasoning_content"), str):
            raise Refused(REASONING_MISSING)  # R17


def check_tool_order(messages: list[dict[str, Any]]) -> None:
    """R14-R16: tool messages directly follow an assistant with tool_calls and answer every call."""
    pending: set[str] | None = None  # ids still unanswered while inside a block of tool answers
    for message in messages:
        if message["role"] == "latest_reminder":  # where DeepSeek checks it is not known: read past it
            continue
        if message["role"] == "tool":
            if pending is None:
                raise Refused(TOOL_WITHOUT_CALLS)
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            raise Refused(CALLS_UNANSWERED)
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        pending = {call["id"] for call in calls} if calls else None
    if pending:
        raise Refused(CALLS_UNANSWERED)


def check_tools(path: str, all_tools: list[dict[str, Any]]) -> None:
    tools = [tool for tool in all_tools if "function" in tool]  # server tools have none (R30, §13.1)
    for k, tool in enumerate(tools):
        name = tool["function"]["name"]
        if not FUNCTION_NAME.fullmatch(name):  # R31
            raise Refused(
                f"Invalid 'tools[{k}].function.name': string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
            )
    strict = [tool["function"].get("strict") is True for tool in tools]
    if path not in BETA_PATHS or not any(strict):
        return  # off /beta `strict: true` is accepted and not enforced (R32, docs/rules-chat.md U11)
    if not all(strict):
        raise Refused("Invalid tools: in strict mode every function must set 'strict': true")
    for k, tool in enumerate(tools):
        for where, why in strict_schema_problems(tool["function"].get("parameters"), "parameters"):
            raise Refused(f"Invalid schema for function 'tools[{k}].function.{where}': {why} (strict mode)")


def strict_schema_problems(schema: Any, root: str) -> Iterator[tuple[str, str]]:
    """DOC-tools: every object lists all its properties in `required` and sets additionalProperties false;
    minLength/maxLength/minItems/maxItems are not supported. Iterative: schemas can nest deeply."""
    stack: list[tuple[str, Any]] = [(root, schema)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue
        for key in STRICT_UNSUPPORTED:
            if key in node:
                yield where, f"'{key}' is not supported"
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            yield from object_problems(where, node)
        stack.extend(schema_children(where, node))


def object_problems(where: str, node: dict[str, Any]) -> Iterator[tuple[str, str]]:
    properties = node.get("properties")
    names = list(properties) if isinstance(properties, dict) else []
    listed = node.get("required")
    required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
    missing = [name for name in names if name not in required]
    if missing:
        yield where, f"all properties must be required (missing: {', '.join(missing)})"
    if node.get("additionalProperties") is not False:
        yield where, "'additionalProperties' must be false"


def schema_children(where: str, node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key in ("properties", "$defs", "definitions"):
        children = node.get(key)
        if isinstance(children, dict):
            yield from ((f"{where}.{key}.{name}", child) for name, child in children.items())
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        children = node.get(key)
        if isinstance(children, list):
            yield from ((f"{where}.{key}[{i}]", child) for i, child in enumerate(children))
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield f"{where}.{key}", node[key]
