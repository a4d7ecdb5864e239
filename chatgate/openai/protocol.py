"""Wire models of DeepSeek's chat-completions request (docs/rules-chat.md#the-request-deepseek-documents).

These types check types and shapes only; sequence and model rules live in `rules.py`.
Unknown fields are accepted (R39): DeepSeek ignores them, and chatgate forwards the client's original
bytes, so nothing is lost by not keeping them here. Types are strict because DeepSeek's deserializer is
(`"1.3"` is not a number, R25).

What repeats (messages, content parts, tool calls, tools) is a `TypedDict`: pydantic validates a
1,000-message history into plain dicts 2.2x faster than into model instances (bench scenario 7). The
request itself and its one-off objects stay models.

Unknown is not invalid (docs/rules-chat.md#unknown-is-not-invalid): a role or content-part type this module
does not model is read by a second, lenient pass (`LenientRequest`, only after the fast one failed on it), as
an `OtherMessage` / `OtherPart` the rules then warn about. Messages and parts are discriminated by a field
in the fast pass: a callable discriminator costs about 0.7 µs per message.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, with_config
from typing_extensions import TypedDict  # pydantic refuses typing.TypedDict before Python 3.12

# allow_inf_nan=False: DeepSeek's parser refuses NaN/Infinity (1e400 overflows); pydantic's does not.
WIRE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class ChatWireModel(BaseModel):
    model_config = ConfigDict(**WIRE, frozen=True)


# --- message content ---------------------------------------------------------


@with_config(WIRE)
class ChatTextPart(TypedDict):
    type: Literal["text"]
    text: str


@with_config(WIRE)
class ImageURL(TypedDict):
    url: str
    detail: NotRequired[str | None]


@with_config(WIRE)
class ImageURLPart(TypedDict):
    type: Literal["image_url"]
    image_url: ImageURL


@with_config(WIRE)
class FileRef(TypedDict):
    file_id: NotRequired[str | None]
    file_data: NotRequired[str | None]
    filename: NotRequired[str | None]


@with_config(WIRE)
class FilePart(TypedDict):
    """DeepSeek documents the flat form (`file_id` or `file_data` beside `type`); the openai SDK sends them
    inside `file`. Both are accepted."""

    type: Literal["file"]
    file: NotRequired[FileRef]
    file_id: NotRequired[str | None]
    file_data: NotRequired[str | None]
    filename: NotRequired[str | None]


ContentPart = Annotated[ChatTextPart | ImageURLPart | FilePart, Field(discriminator="type")]


@with_config(WIRE)
class ChatOtherPart(TypedDict):
    """A content-part type chatgate does not know (DeepSeek's server-tool results may come back as one)."""

    type: str


PART_TYPES = ("text", "image_url", "file")


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "parts"
    return None


Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[ContentPart], Tag("parts")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="content must be a string or an array of content parts",
    ),
]

# --- tool calls ----------------------------------------------------------------


@with_config(WIRE)
class FunctionCall(TypedDict):
    name: str
    arguments: str  # a JSON *string*, not an object: the most common mistake (seed, R11)


@with_config(WIRE)
class ToolCall(TypedDict):
    """A function call; a call of another type (how DeepSeek's server tools may come back: not documented)
    has no `function` and is forwarded with a warning (R11)."""

    id: str
    type: NotRequired[str | None]
    function: NotRequired[FunctionCall]


# --- messages ------------------------------------------------------------------


@with_config(WIRE)
class SystemMessage(TypedDict):
    role: Literal["system"]
    content: str
    name: NotRequired[str | None]


@with_config(WIRE)
class UserMessage(TypedDict):
    role: Literal["user"]
    content: Content
    name: NotRequired[str | None]


@with_config(WIRE)
class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: NotRequired[str | None]
    name: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCall] | None]
    reasoning_content: NotRequired[str | None]
    prefix: NotRequired[bool | None]


@with_config(WIRE)
class ToolMessage(TypedDict):
    role: Literal["tool"]
    content: Content  # arrays: only vision models accept them (docs/rules-chat.md U4), checked by the rules
    tool_call_id: str


@with_config(WIRE)
class LatestReminderMessage(TypedDict):
    """Undocumented, but DeepSeek's deserializer lists it among the accepted roles (docs/rules-chat.md, R5):
    never refuse it."""

    role: Literal["latest_reminder"]
    content: NotRequired[Content | None]


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage | LatestReminderMessage,
    Field(discriminator="role"),
]
ROLES = ("system", "user", "assistant", "tool", "latest_reminder")
# Roles DeepSeek was seen refusing: "unknown variant `developer`, expected one of `system`, `user`,
# `assistant`, `tool`, `latest_reminder`" (R5). Other unknown roles are forwarded with a warning.
REFUSED_ROLES = frozenset({"developer"})

# --- request -------------------------------------------------------------------


class ChatThinking(ChatWireModel):
    type: str | None = None


class ResponseFormat(ChatWireModel):
    type: str


class StreamOptions(ChatWireModel):
    include_usage: bool | None = None


@with_config(WIRE)
class FunctionDef(TypedDict):
    name: str
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[bool | None]


@with_config(WIRE)
class ChatTool(TypedDict):
    """A function tool `{type: function, function}`, or a type without `function`: DeepSeek's server tools
    `{"type": "deepseek_web_search"}` (R30), or a type chatgate does not know."""

    type: str
    function: NotRequired[FunctionDef]


class NamedFunction(ChatWireModel):
    name: str


class ToolChoiceFunction(ChatWireModel):
    type: str
    function: NamedFunction | None = None  # a function's; a server tool's choice has none (R33)


class ChatSafetyCheck(ChatWireModel):
    level: str | None = None


class ChatCompletionRequest(ChatWireModel):
    model: str
    messages: list[Message]
    thinking: ChatThinking | None = None
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    response_format: ResponseFormat | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | ToolChoiceFunction | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    user_id: str | None = None
    n: int | None = None
    safety_check: ChatSafetyCheck | None = None


# --- the lenient pass: unknown roles and part types ---------------------------------------------------


def _part_kind(value: Any) -> str | None:
    if not isinstance(value, dict) or "type" not in value:
        return None
    kind = value["type"]
    return kind if isinstance(kind, str) and kind in PART_TYPES else "~other"


AnyPart = Annotated[
    Annotated[ChatTextPart, Tag("text")] | Annotated[ImageURLPart, Tag("image_url")]
    | Annotated[FilePart, Tag("file")] | Annotated[ChatOtherPart, Tag("~other")],
    Discriminator(_part_kind),
]
AnyContent = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[AnyPart], Tag("parts")],
    Discriminator(_content_kind, custom_error_type="content_type",
                  custom_error_message="content must be a string or an array of content parts"),
]


@with_config(WIRE)
class AnyUserMessage(TypedDict):
    role: Literal["user"]
    content: AnyContent
    name: NotRequired[str | None]


@with_config(WIRE)
class AnyToolMessage(TypedDict):
    role: Literal["tool"]
    content: AnyContent
    tool_call_id: str


@with_config(WIRE)
class AnyReminderMessage(TypedDict):
    role: Literal["latest_reminder"]
    content: NotRequired[AnyContent | None]


@with_config(WIRE)
class OtherMessage(TypedDict):
    """A role chatgate does not know: forwarded with a warning (R5)."""

    role: str
    content: NotRequired[Any]


def _role_kind(value: Any) -> str | None:
    if not isinstance(value, dict) or "role" not in value:
        return None
    role = value["role"]
    return role if isinstance(role, str) and role in ROLES else "~other"


AnyMessage = Annotated[
    Annotated[SystemMessage, Tag("system")] | Annotated[AnyUserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")] | Annotated[AnyToolMessage, Tag("tool")]
    | Annotated[AnyReminderMessage, Tag("latest_reminder")] | Annotated[OtherMessage, Tag("~other")],
    Discriminator(_role_kind),
]


class LenientRequest(ChatCompletionRequest):
    """The request read again when the fast pass failed on a role or part type it does not know."""

    messages: list[AnyMessage]  # type: ignore[assignment]
