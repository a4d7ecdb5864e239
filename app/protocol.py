"""Wire models of DeepSeek's chat-completions request (deepseek-api.md §3, §4).

These models check types and shapes only; sequence and model rules live in `validate.py`.
Every model keeps unknown fields (`extra="allow"`): DeepSeek ignores them and so do we (R39).
Types are strict because DeepSeek's deserializer is (`"1.3"` is not a number, R25).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class WireModel(BaseModel):
    # allow_inf_nan=False: DeepSeek's parser refuses NaN/Infinity (1e400 overflows); pydantic's does not.
    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)


# --- message content ---------------------------------------------------------


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageURL(WireModel):
    url: str
    detail: str | None = None


class ImageURLPart(WireModel):
    type: Literal["image_url"]
    image_url: ImageURL


class FileRef(WireModel):
    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


class FilePart(WireModel):
    type: Literal["file"]
    file: FileRef


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


class FunctionCall(WireModel):
    name: str
    arguments: str  # a JSON *string*, not an object: the most common mistake (seed, R11)


class ToolCall(WireModel):
    id: str
    type: Literal["function"] | None = None
    function: FunctionCall


# --- messages ------------------------------------------------------------------


class SystemMessage(WireModel):
    role: Literal["system"]
    content: str
    name: str | None = None


class UserMessage(WireModel):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(WireModel):
    role: Literal["assistant"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    prefix: bool | None = None


class ToolMessage(WireModel):
    role: Literal["tool"]
    content: Content  # arrays: only vision models accept them (§12.4), checked in validate.py
    tool_call_id: str


class LatestReminderMessage(WireModel):
    """Undocumented, but DeepSeek's deserializer lists it among the accepted roles (§4): never refuse it."""

    role: Literal["latest_reminder"]
    content: Content | None = None


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


class FunctionDef(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(WireModel):
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
