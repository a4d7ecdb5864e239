"""Wire models of DeepSeek's chat-completions request (docs/rules-chat.md#the-request-deepseek-documents).

These types check types and shapes only; sequence and model rules live in `rules.py`.
Unknown fields are accepted (R39): DeepSeek ignores them, and chatgate forwards the client's original
bytes, so nothing is lost by not keeping them here. Types are strict because DeepSeek's deserializer is
(`"1.3"` is not a number, R25).

What repeats (messages, content parts, tool calls, tools) is a `TypedDict`: pydantic validates a
1,000-message history into plain dicts 2.2x faster than into model instances (bench scenario 7). The
request itself and its one-off objects stay models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, with_config
from typing_extensions import TypedDict  # pydantic refuses typing.TypedDict before Python 3.12

# allow_inf_nan=False: DeepSeek's parser refuses NaN/Infinity (1e400 overflows); pydantic's does not.
WIRE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class WireModel(BaseModel):
    model_config = ConfigDict(**WIRE, frozen=True)


# --- message content ---------------------------------------------------------


@with_config(WIRE)
class TextPart(TypedDict):
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


ContentPart = Annotated[TextPart | ImageURLPart | FilePart, Field(discriminator="type")]


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
    id: str
    type: NotRequired[Literal["function"] | None]
    function: FunctionCall


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

# --- request -------------------------------------------------------------------


class Thinking(WireModel):
    type: str | None = None


class ResponseFormat(WireModel):
    type: str


class StreamOptions(WireModel):
    include_usage: bool | None = None


@with_config(WIRE)
class FunctionDef(TypedDict):
    name: str
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[bool | None]


@with_config(WIRE)
class Tool(TypedDict):
    type: str
    function: FunctionDef


class NamedFunction(WireModel):
    name: str


class ToolChoiceFunction(WireModel):
    type: str
    function: NamedFunction


class ChatCompletionRequest(WireModel):
    model: str
    messages: list[Message]
    thinking: Thinking | None = None
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
    tools: list[Tool] | None = None
    tool_choice: str | ToolChoiceFunction | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    user_id: str | None = None
    n: int | None = None
